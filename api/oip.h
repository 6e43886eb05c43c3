/*
 * The Open Inference Protocol front end's own vocabulary, shared by its
 * reader (oip_read.c: the request into the call's fields) and its writer
 * (oip_answer.c: the call's results as the protocol's outputs, and the
 * models' metadata). Private to api/.
 */
#ifndef API_OIP_H
#define API_OIP_H

#include "request.h"

#include <string.h>

/* output, lse, weights, stats, and a gradient per input */
#define OIP_MAX_OUTPUTS (API_MAX_RESULTS + 1)
/* The output that is the statistics, not a planned result. */
#define OIP_STATS (-2)

typedef struct {
    char name[48];
    int binary;  /* -1: as binary_data_output says; 0 or 1: its own binary_data */
    int result;  /* index in the call's results, or OIP_STATS */
} oip_output;

struct api_oip {
    const char *model;
    char *id;            /* the request's "id" as its JSON string text, or NULL */
    bool binary_default; /* binary_data_output */
    bool listed;         /* the request named its outputs */
    int n_outputs;
    oip_output outputs[OIP_MAX_OUTPUTS];
    codec_dtype dtype;     /* of the outputs: output_dtype */
};

static inline const char *oip_model_name(const api_operation *o)
{
    return o == &api_multihead_op ? "multihead" : "attention";
}

static inline int oip_field_index(const api_operation *o, const char *name)
{
    for (size_t i = 0; i < o->n_fields; i++)
        if (!strcmp(o->fields[i].name, name))
            return (int)i;
    return -1;
}

static inline bool oip_is_tensor(const api_field *f)
{
    return f->kind == API_FIELD_TENSOR || f->kind == API_FIELD_OPERAND
           || f->kind == API_FIELD_MASK;
}

/* "FP32", "FP16", "BF16", "BOOL": the protocol's names of the codec's dtypes. */
static inline const char *oip_datatype_name(codec_dtype d)
{
    switch (d) {
    case CODEC_F32: return "FP32";
    case CODEC_F16: return "FP16";
    case CODEC_BF16: return "BF16";
    case CODEC_BOOL: return "BOOL";
    }
    return "FP32";
}


#endif /* API_OIP_H */
