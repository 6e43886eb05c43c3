/*
 * The answer of an Open Inference Protocol request (see oip_read.c for the
 * mapping): the outputs asked for matched to the call's planned results,
 * then written as the protocol's outputs, JSON data or raw bytes after the
 * JSON text; and the models' metadata (GET /v2/models/{model}).
 */
#include "oip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- plan */

static const char *output_name(const api_result *r, char *buf, size_t cap)
{
    if (!r->in_grad)
        return r->name;
    snprintf(buf, cap, "grad_%s", r->name);
    return buf;
}

static int find_result(const api_call *c, const char *name)
{
    char buf[48];
    for (int i = 0; i < c->n_results; i++)
        if (!strcmp(output_name(&c->results[i], buf, sizeof buf), name))
            return i;
    return -1;
}

bool api_oip_plan(api_call *c, api_error *err)
{
    api_oip *x = c->oip;
    const api_value *dt = &c->f[c->op->f_output_dtype];
    x->dtype = dt->present ? dt->dtype : CODEC_F32;
    if (!x->listed) {
        char buf[48];
        for (int i = 0; i < c->n_results; i++) {
            x->outputs[x->n_outputs] = (oip_output){.binary = -1, .result = i};
            snprintf(x->outputs[x->n_outputs++].name, sizeof x->outputs[0].name, "%s",
                     output_name(&c->results[i], buf, sizeof buf));
        }
        if (c->want_stats)
            x->outputs[x->n_outputs++] = (oip_output){.name = "stats", .binary = -1,
                                                      .result = OIP_STATS};
    }
    bool any_json = false;
    for (int i = 0; i < x->n_outputs; i++) {
        oip_output *o = &x->outputs[i];
        if (x->listed) {
            o->result = !strcmp(o->name, "stats") ? OIP_STATS : find_result(c, o->name);
            if (o->result == -1) {
                bool grad = !strncmp(o->name, "grad_", 5);
                int f = grad ? oip_field_index(c->op, o->name + 5) : -1;
                if (grad && f >= 0 && !c->want_grad)
                    return api_fail(err, 400, "missing_field", "grad_output",
                                    "the output %s needs the input grad_output (the "
                                    "gradient of a loss with respect to the output)", o->name);
                if (f >= 0 && !c->f[f].present)
                    return api_fail(err, 422, "invalid_value", "outputs",
                                    "the output %s needs the input %s, which this request "
                                    "does not give", o->name, o->name + 5);
                return api_fail(err, 400, "unknown_field", "outputs",
                                "the model %s has no output \"%.40s\"; its outputs are "
                                "output, lse, weights, stats and grad_<input> for each "
                                "differentiable input given", x->model, o->name);
            }
        }
        if (o->binary < 0)
            o->binary = x->binary_default;
        any_json = any_json || !o->binary;
    }
    if (any_json && x->dtype != CODEC_F32)
        return api_fail(err, 422, "invalid_value", "output_dtype",
                        "%s outputs travel as binary data only: ask for them with "
                        "\"binary_data_output\": true (or \"binary_data\" on each output)",
                        oip_datatype_name(x->dtype));
    c->enc = any_json ? CODEC_ENC_FLAT
           : x->dtype == CODEC_F16 ? CODEC_ENC_BASE64_F16
           : x->dtype == CODEC_BF16 ? CODEC_ENC_BASE64_BF16 : CODEC_ENC_BASE64;
    return true;
}

/* -------------------------------------------------------------- encode */

/* The statistics as /v1 writes them: {"scores": ..., ...}. */
static void stats_text(const api_call *c, codec_buf *t)
{
    api_write_stats(t, &c->stats); /* `,"stats":{...}` */
}

static const char *stats_object(const codec_buf *t)
{
    static const char prefix[] = ",\"stats\":";
    return t->len >= sizeof prefix - 1 ? t->data + sizeof prefix - 1 : "";
}

static void put_shape(codec_buf *b, int rank, const int64_t *shape)
{
    codec_buf_puts(b, "[");
    for (int i = 0; i < rank; i++)
        codec_buf_printf(b, "%s%lld", i ? "," : "", (long long)shape[i]);
    codec_buf_puts(b, "]");
}

_Static_assert(OIP_MAX_OUTPUTS <= API_MAX_BLOCKS, "raise API_MAX_BLOCKS");

/* A float32 result is sent as the array it was computed into when that
 * array already holds the bytes to send: little-endian float32. */
static bool sent_as_computed(codec_dtype d)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return d == CODEC_F32;
#else
    (void)d;
    return false;
#endif
}

/* The binary outputs, in the order of the outputs, as res's blocks after
 * the JSON text of json_len bytes: the statistics as a BYTES element (a
 * 4-byte little-endian length, then the text), a result in its output
 * dtype (handed over as it is, or written into a block of its own). */
static bool binary_blocks(api_call *c, const char *stats_json, size_t stats_len,
                          size_t json_len, api_response *res)
{
    api_oip *x = c->oip;
    api_block *blocks = calloc((size_t)x->n_outputs, sizeof *blocks);
    if (!blocks)
        return false;
    int n = 0;
    bool ok = true;
    for (int i = 0; ok && i < x->n_outputs; i++) {
        const oip_output *o = &x->outputs[i];
        if (!o->binary)
            continue;
        api_block *blk = &blocks[n++];
        if (o->result == OIP_STATS) {
            blk->len = 4 + stats_len;
            uint8_t *p = codec_tensor_alloc(blk->len);
            if (!(blk->data = p)) {
                ok = false;
                break;
            }
            for (int k = 0; k < 4; k++)
                p[k] = (uint8_t)(stats_len >> (8 * k));
            memcpy(p + 4, stats_json, stats_len);
            continue;
        }
        api_result *r = &c->results[o->result];
        blk->len = (size_t)r->count * codec_dtype_size(x->dtype);
        if (sent_as_computed(x->dtype)) {
            blk->data = r->data; /* the call lets go of it */
            r->data = NULL;
            continue;
        }
        if (!(blk->data = codec_tensor_alloc(blk->len ? blk->len : 1))) {
            ok = false;
            break;
        }
        codec_tensor_to_bytes(x->dtype, r->data, blk->data, (size_t)r->count);
        api_free_floats(r->data);
        r->data = NULL;
    }
    if (!ok) {
        for (int i = 0; i < n; i++)
            codec_tensor_release(blocks[i].data);
        free(blocks);
        return false;
    }
    res->header_len = json_len;
    res->blocks = blocks;
    res->n_blocks = n;
    return true;
}

bool api_oip_encode(api_call *c, codec_buf *b, api_response *res)
{
    api_oip *x = c->oip;
    codec_buf stats = {0};
    if (c->want_stats)
        stats_text(c, &stats);
    const char *stats_json = stats.data ? stats_object(&stats) : "";
    size_t stats_len = strlen(stats_json);
    codec_buf_puts(b, "{\"model_name\":\"");
    codec_buf_puts(b, x->model);
    codec_buf_puts(b, "\"");
    if (x->id) {
        codec_buf_puts(b, ",\"id\":");
        codec_buf_puts(b, x->id);
    }
    codec_buf_puts(b, ",\"outputs\":[");
    bool any_binary = false;
    for (int i = 0; i < x->n_outputs; i++) {
        const oip_output *o = &x->outputs[i];
        codec_buf_printf(b, "%s{\"name\":\"%s\",\"datatype\":\"", i ? "," : "", o->name);
        if (o->result == OIP_STATS) {
            /* One string: the /v1 statistics object, as BYTES. */
            codec_buf_puts(b, "BYTES\",\"shape\":[1],");
            if (o->binary) {
                codec_buf_printf(b, "\"parameters\":{\"binary_data_size\":%zu}}", 4 + stats_len);
                any_binary = true;
                continue;
            }
            codec_buf_puts(b, "\"data\":[\"");
            size_t cap = CODEC_ESCAPED_MAX(stats_len) + 1;
            char *esc = malloc(cap);
            if (!esc) {
                b->failed = true;
                break;
            }
            codec_escape_text(esc, cap, stats_json, stats_len, 0);
            codec_buf_puts(b, esc);
            free(esc);
            codec_buf_puts(b, "\"]}");
            continue;
        }
        const api_result *r = &c->results[o->result];
        codec_dtype d = o->binary ? x->dtype : CODEC_F32;
        codec_buf_puts(b, oip_datatype_name(d));
        codec_buf_puts(b, "\",\"shape\":");
        put_shape(b, r->rank, r->shape);
        if (o->binary) {
            codec_buf_printf(b, ",\"parameters\":{\"binary_data_size\":%lld}}",
                           (long long)(r->count * (int64_t)codec_dtype_size(d)));
            any_binary = true;
            continue;
        }
        codec_buf_puts(b, ",\"data\":");
        /* a rank-1 view: the flat array of numbers */
        codec_tensor_encode(b, r->data, 1, &r->count, CODEC_ENC_NESTED);
        codec_buf_puts(b, "}");
    }
    codec_buf_puts(b, "]}");
    bool ok = !any_binary || binary_blocks(c, stats_json, stats_len, b->len, res);
    codec_buf_free(&stats);
    api_lap(&c->t, &c->t.encode_ms);
    return ok;
}

/* ------------------------------------------------------------- metadata */

/* The largest rank each input takes (its metadata shape is that many -1s)
 * and whether the answer has its gradient. */
typedef struct {
    const char *name;
    int rank;
    bool grad;
} oip_input_meta;

static const oip_input_meta attention_inputs[] = {
    {"q", 4, true}, {"k", 4, true}, {"v", 4, true}, {"mask", 4, false},
    {"grad_output", 4, false}, {"alibi_slopes", 2, false},
};
static const oip_input_meta multihead_inputs[] = {
    {"x", 3, true}, {"context", 3, true}, {"w_q", 2, true}, {"w_k", 2, true},
    {"w_v", 2, true}, {"w_o", 2, true}, {"b_q", 1, true}, {"b_k", 1, true},
    {"b_v", 1, true}, {"b_o", 1, true}, {"mask", 4, false}, {"grad_output", 3, false},
    {"alibi_slopes", 2, false},
};

static void put_meta(codec_buf *b, const char *name, const char *datatype, int rank, bool *first)
{
    codec_buf_printf(b, "%s{\"name\":\"%s\",\"datatype\":\"%s\",\"shape\":[", *first ? "" : ",",
                   name, datatype);
    for (int i = 0; i < rank; i++)
        codec_buf_puts(b, i ? ",-1" : "-1");
    codec_buf_puts(b, "]}");
    *first = false;
}

char *api_oip_model_metadata(api_op op, size_t *len)
{
    const api_operation *o = op == API_OP_MULTIHEAD ? &api_multihead_op : &api_attention_op;
    const oip_input_meta *meta = op == API_OP_MULTIHEAD ? multihead_inputs : attention_inputs;
    size_t n_meta = op == API_OP_MULTIHEAD
                        ? sizeof multihead_inputs / sizeof *multihead_inputs
                        : sizeof attention_inputs / sizeof *attention_inputs;
    int out_rank = op == API_OP_MULTIHEAD ? 3 : 4;
    codec_buf b = {0};
    codec_buf_printf(&b, "{\"name\":\"%s\",\"platform\":\"attnd\",\"inputs\":[",
                   oip_model_name(o));
    bool first = true;
    for (size_t i = 0; i < o->n_fields; i++) {
        if (!oip_is_tensor(&o->fields[i]))
            continue;
        const oip_input_meta *m = NULL;
        for (size_t j = 0; j < n_meta; j++)
            if (!strcmp(meta[j].name, o->fields[i].name))
                m = &meta[j];
        put_meta(&b, o->fields[i].name,
                 o->fields[i].kind == API_FIELD_MASK ? "BOOL" : "FP32",
                 m ? m->rank : CODEC_MAX_RANK, &first);
    }
    codec_buf_puts(&b, "],\"outputs\":[");
    first = true;
    put_meta(&b, "output", "FP32", out_rank, &first);
    put_meta(&b, "lse", "FP32", out_rank - 1, &first);
    put_meta(&b, "weights", "FP32", 4, &first);
    codec_buf_puts(&b, ",{\"name\":\"stats\",\"datatype\":\"BYTES\",\"shape\":[1]}");
    for (size_t j = 0; j < n_meta; j++)
        if (meta[j].grad) {
            char name[48];
            snprintf(name, sizeof name, "grad_%s", meta[j].name);
            put_meta(&b, name, "FP32", meta[j].rank, &first);
        }
    codec_buf_puts(&b, "]}");
    if (b.failed) {
        codec_buf_free(&b);
        return NULL;
    }
    *len = b.len;
    return b.data;
}
