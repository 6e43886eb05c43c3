/*
 * The Open Inference Protocol (KServe v2, REST) as a second front end of the
 * same operations: POST /v2/models/{attention|multihead}/infer is read into
 * the very call that a /v1 body makes (the fields of the operation's table,
 * api_value by api_value), and that call's results are written back as the
 * protocol's outputs. Validation, cost, limits, computation and errors are
 * the skeleton's (handle.c), once for both protocols.
 *
 * The mapping:
 *   inputs      the operation's tensor fields by name (q, k, v, mask,
 *               grad_output, alibi_slopes; x, context, w_q, ...): datatype
 *               FP32, FP16 or BF16 (BOOL or a float type for a mask), "shape",
 *               and either "data" (a JSON array, flat or nested) or
 *               "parameters": {"binary_data_size": N} with N bytes after the
 *               JSON text (the binary tensor data extension).
 *   parameters  every other field of the table, in its /v1 form (causal,
 *               scale, window, rope, num_heads, output_dtype, ...), and
 *               binary_data_output.
 *   outputs     output, lse, weights, stats, grad_<input>; asking for lse,
 *               weights or stats is asking for return_lse, return_weights
 *               or return_stats. Without "outputs": the output, what the
 *               return_* parameters ask for, and the gradients when
 *               grad_output is given.
 *
 * A binary body is [JSON text][tensor bytes...]: Inference-Header-Content-
 * Length says where the JSON ends, and the inputs' binary_data_size must add
 * up to exactly the rest, all of which is checked before anything the sizes
 * announce is allocated.
 */
#include "oip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void api_oip_free(api_oip *o)
{
    if (!o)
        return;
    free(o->id);
    free(o);
}

/* ------------------------------------------------------------- helpers */

/* The text of a string member (validated JSON) into out, or 400 wrong_type. */
static bool string_member(const codec_member *m, const char *what, char *out, size_t cap,
                          api_error *err)
{
    if (*m->value != '"')
        return api_fail(err, 400, "wrong_type", what, "%s must be a string", what);
    api_string_value(m, out, cap);
    return true;
}

static bool bool_member(const codec_member *m, const char *what, bool *out, api_error *err)
{
    if (*m->value != 't' && *m->value != 'f')
        return api_fail(err, 400, "wrong_type", what,
                        "%s must be true or false (a JSON boolean)", what);
    *out = *m->value == 't';
    return true;
}

/* The members of the object at m's value, at most max. */
static bool object_members(const codec_member *m, const char *what, codec_member *out,
                           size_t max, size_t *count, api_error *err)
{
    if (*m->value != '{')
        return api_fail(err, 400, "wrong_type", what, "%s must be an object", what);
    codec_error ce;
    return codec_members(m->value, m->value_end, out, max, count, what, &ce) ||
           api_fail_codec(err, &ce);
}

static bool unknown_member(const codec_member *m, const char *where, const char *known,
                           api_error *err)
{
    char key[80];
    codec_member_key_shown(m, key, sizeof key);
    return api_fail(err, 400, "unknown_field", where, "%s has an unknown field \"%s\"; its "
                    "fields are %s", where, key, known);
}

/* "FP32" ... for a dtype, and back. */
static bool datatype_of(const char *s, codec_dtype *d)
{
    static const codec_dtype all[] = {CODEC_F32, CODEC_F16, CODEC_BF16, CODEC_BOOL};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (!strcmp(s, oip_datatype_name(all[i]))) {
            *d = all[i];
            return true;
        }
    return false;
}


/* --------------------------------------------------------------- inputs */

/* One entry of "inputs", read but not decoded yet. */
typedef struct {
    int field;            /* in the operation's table */
    codec_dtype dtype;
    int rank;
    int64_t shape[CODEC_MAX_RANK];
    int64_t count;
    codec_member data;     /* the JSON data (data.value NULL when absent) */
    bool binary;
    uint64_t size;        /* binary_data_size */
} oip_input;

/* A count as JSON text [p, end): decimal digits only (no sign, fraction or
 * exponent), at most 15 of them, so that it is exact; -1 otherwise. */
static int64_t count_text(const char *p, const char *end)
{
    if (p == end || end - p > 15)
        return -1;
    int64_t v = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static bool read_shape(const codec_member *m, const char *name, oip_input *in, api_error *err)
{
    if (*m->value != '[')
        return api_fail(err, 400, "wrong_type", name,
                        "the shape of %s must be an array of integers", name);
    const char *p = codec_skip_ws(m->value + 1, m->value_end);
    in->rank = 0;
    in->count = 1;
    while (p < m->value_end && *p != ']') {
        const char *after = codec_skip_value(p, m->value_end);
        if (in->rank == CODEC_MAX_RANK)
            return api_fail(err, 422, "invalid_shape", name,
                            "the shape of %s has more than %d dimensions", name, CODEC_MAX_RANK);
        int64_t d = count_text(p, after);
        if (d < 0 && *p == '-')
            return api_fail(err, 422, "invalid_shape", name,
                            "the shape of %s has a negative dimension %.20s", name, p);
        if (d < 0)
            return api_fail(err, 400, "wrong_type", name,
                            "the shape of %s must be an array of integers (at most 15 digits "
                            "each), got %.20s", name, p);
        if (__builtin_mul_overflow(in->count, d, &in->count) || in->count > ((int64_t)1 << 40))
            return api_fail(err, 422, "invalid_shape", name,
                            "the shape of %s holds too many elements", name);
        in->shape[in->rank++] = d;
        p = codec_skip_ws(after, m->value_end);
        if (p < m->value_end && *p == ',')
            p = codec_skip_ws(p + 1, m->value_end);
    }
    return true;
}

/* The input's own members: name, shape, datatype, parameters, data. */
static bool read_input(const api_operation *o, const codec_member *entry, int index,
                       oip_input *in, api_error *err)
{
    char where[40];
    snprintf(where, sizeof where, "inputs[%d]", index);
    codec_member m[8];
    size_t n = 0;
    if (!object_members(entry, where, m, 8, &n, err))
        return false;
    const codec_member *name = NULL, *shape = NULL, *datatype = NULL, *params = NULL;
    *in = (oip_input){.field = -1};
    for (size_t i = 0; i < n; i++) {
        const char *k = m[i].key_too_long ? "" : m[i].key;
        if (!strcmp(k, "name")) name = &m[i];
        else if (!strcmp(k, "shape")) shape = &m[i];
        else if (!strcmp(k, "datatype")) datatype = &m[i];
        else if (!strcmp(k, "parameters")) params = &m[i];
        else if (!strcmp(k, "data")) in->data = m[i];
        else
            return unknown_member(&m[i], where, "name, shape, datatype, parameters, data",
                                  err);
    }
    if (!name)
        return api_fail(err, 400, "missing_field", where, "%s has no \"name\"", where);
    char text[64];
    if (!string_member(name, where, text, sizeof text, err))
        return false;
    in->field = oip_field_index(o, text);
    if (in->field < 0 || !oip_is_tensor(&o->fields[in->field])) {
        if (in->field >= 0)
            return api_fail(err, 400, "unknown_field", text,
                            "%s is not an input of the model %s: send it among the "
                            "request's \"parameters\"", text, oip_model_name(o));
        api_field names[API_MAX_FIELDS];
        size_t k = 0;
        char list[300] = "";
        for (size_t i = 0; i < o->n_fields; i++)
            if (oip_is_tensor(&o->fields[i])) {
                names[k++] = o->fields[i];
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s",
                         k > 1 ? ", " : "", o->fields[i].name);
            }
        const char *near = api_nearest_field(text, names, k);
        if (near)
            return api_fail(err, 400, "unknown_field", text,
                            "the model %s has no input \"%.40s\" (did you mean \"%s\"?)",
                            oip_model_name(o), text, near);
        return api_fail(err, 400, "unknown_field", text,
                        "the model %s has no input \"%.40s\"; its inputs are %s",
                        oip_model_name(o), text, list);
    }
    const char *fname = o->fields[in->field].name;
    if (!shape)
        return api_fail(err, 400, "missing_field", fname, "input %s has no \"shape\"", fname);
    if (!datatype)
        return api_fail(err, 400, "missing_field", fname, "input %s has no \"datatype\"",
                        fname);
    if (!read_shape(shape, fname, in, err))
        return false;
    if (!string_member(datatype, fname, text, sizeof text, err))
        return false;
    bool mask = o->fields[in->field].kind == API_FIELD_MASK;
    if (!datatype_of(text, &in->dtype) || (in->dtype == CODEC_BOOL && !mask))
        return api_fail(err, 400, "wrong_type", fname,
                        "input %s has datatype \"%.20s\"; it takes %s", fname, text,
                        mask ? "BOOL, FP32, FP16 or BF16" : "FP32, FP16 or BF16");
    if (params) {
        codec_member pm[4];
        size_t np = 0;
        char pwhere[80];
        snprintf(pwhere, sizeof pwhere, "the parameters of input %s", fname);
        if (!object_members(params, pwhere, pm, 4, &np, err))
            return false;
        for (size_t i = 0; i < np; i++) {
            if (pm[i].key_too_long || strcmp(pm[i].key, "binary_data_size") != 0)
                return unknown_member(&pm[i], pwhere, "binary_data_size", err);
            int64_t size = count_text(pm[i].value, pm[i].value_end);
            if (size < 0)
                return api_fail(err, 400, "wrong_type", fname,
                                "binary_data_size of input %s must be a byte count (an "
                                "integer of at most 15 digits)", fname);
            in->size = (uint64_t)size;
            in->binary = true;
        }
    }
    if (in->binary && in->data.value)
        return api_fail(err, 400, "wrong_type", fname,
                        "input %s has both \"data\" and binary_data_size; send one", fname);
    if (!in->binary && !in->data.value)
        return api_fail(err, 400, "missing_field", fname,
                        "input %s has no \"data\" (nor a binary_data_size)", fname);
    if (in->data.value && *in->data.value == 'n')
        return api_fail(err, 400, "missing_field", fname, "input %s has \"data\": null",
                        fname);
    if (in->binary) {
        uint64_t want = (uint64_t)in->count * codec_dtype_size(in->dtype);
        char s[120];
        if (in->size != want)
            return api_fail(err, 422, "shape_mismatch", fname,
                            "input %s has binary_data_size %llu, but %s of shape %s takes "
                            "%llu bytes", fname, (unsigned long long)in->size,
                            oip_datatype_name(in->dtype),
                            api_shape_text(s, sizeof s, in->rank, in->shape),
                            (unsigned long long)want);
    }
    return true;
}

/* The decoded tensor of a JSON input: numbers (or booleans for a BOOL mask)
 * in the declared shape, rounded to the declared datatype. */
static bool decode_json(const codec_doc *doc, const api_operation *o, const oip_input *in,
                        codec_tensor *t, api_error *err)
{
    const char *fname = o->fields[in->field].name;
    const codec_member *d = &in->data;
    if (*d->value != '[')
        return api_fail(err, 400, "wrong_type", fname,
                        "the data of input %s must be an array (flat or nested)", fname);
    bool mask = o->fields[in->field].kind == API_FIELD_MASK;
    codec_error ce;
    if (!codec_doc_tensor(doc, d->value, d->value_end, fname, mask, t, &ce))
        return api_fail_codec(err, &ce);
    char s1[120], s2[120];
    bool is_bool = t->dtype == CODEC_BOOL;
    if (t->count > 0 && is_bool != (in->dtype == CODEC_BOOL)) {
        codec_tensor_free(t);
        return api_fail(err, 400, "wrong_type", fname, "input %s is %s but its data holds %s",
                        fname, oip_datatype_name(in->dtype), is_bool ? "booleans" : "numbers");
    }
    bool same_shape = t->rank == in->rank;
    for (int i = 0; same_shape && i < t->rank; i++)
        same_shape = t->shape[i] == in->shape[i];
    if (t->count != in->count || (t->rank > 1 && !same_shape)) {
        api_fail(err, 422, "shape_mismatch", fname,
                 "input %s has shape %s (%lld elements) but its data is %s", fname,
                 api_shape_text(s1, sizeof s1, in->rank, in->shape), (long long)in->count,
                 api_shape_text(s2, sizeof s2, t->rank, t->shape));
        codec_tensor_free(t);
        return false;
    }
    if (in->dtype == CODEC_BOOL && t->count == 0) {
        /* [] holds no booleans to say so: an empty mask all the same */
        codec_tensor_release(t->f32);
        *t = (codec_tensor){.dtype = CODEC_BOOL, .b8 = codec_tensor_alloc(1)};
        if (!t->b8)
            return api_fail(err, 500, "out_of_memory", fname, "out of memory for %s", fname);
    }
    /* A number finite as a float32 may round to an infinity in FP16 or BF16
     * (70000 as FP16): refused as that infinity sent as binary data is,
     * before the rounding makes it one. */
    size_t at;
    if (t->dtype == CODEC_F32 && t->f32 && in->dtype != CODEC_F32 &&
        !codec_half_fits(in->dtype, t->f32, (size_t)t->count, &at)) {
        api_fail(err, 400, "invalid_number", fname,
                 "input %s is %s, but its element %zu (row-major) is %g, which is not finite "
                 "as %s (|x| < %s)", fname, oip_datatype_name(in->dtype), at, (double)t->f32[at],
                 oip_datatype_name(in->dtype), in->dtype == CODEC_F16 ? "65520" : "3.3961e38");
        codec_tensor_free(t);
        return false;
    }
    t->rank = in->rank;
    memcpy(t->shape, in->shape, sizeof t->shape);
    t->count = in->count;
    if (t->dtype == CODEC_F32 && t->f32)
        codec_tensor_round(in->dtype, t->f32, (size_t)t->count);
    return true;
}

/* The decoded tensor of a binary input at bytes[0..in->size): the codec's,
 * as /v1's base64 bytes are read (finite numbers, bools 0 or 1). FP32 and
 * BOOL inputs are read where they lie in the body (codec_tensor_view_raw):
 * the body outlives the call, and copying tens of megabytes into fresh
 * pages cost more than all of the rest of the decoding. */
static bool decode_binary(const api_operation *o, const oip_input *in, const uint8_t *bytes,
                          codec_tensor *t, api_error *err)
{
    codec_error ce;
    return codec_tensor_view_raw(bytes, in->dtype, in->rank, in->shape,
                                 o->fields[in->field].name, t, &ce) ||
           api_fail_codec(err, &ce);
}

/* Where the JSON text ends: Inference-Header-Content-Length, or the body. */
static bool header_length(const char *text, size_t len, size_t *json_len, api_error *err)
{
    if (!text) {
        *json_len = len;
        return true;
    }
    size_t n = strlen(text);
    uint64_t v = 0;
    bool ok = n > 0 && n <= 19;
    for (size_t i = 0; ok && i < n; i++) {
        ok = text[i] >= '0' && text[i] <= '9';
        v = v * 10 + (uint64_t)(text[i] - '0');
    }
    if (!ok)
        return api_fail(err, 400, "invalid_framing", "Inference-Header-Content-Length",
                        "Inference-Header-Content-Length \"%.40s\" is not a byte count", text);
    if (v > len)
        return api_fail(err, 400, "invalid_framing", "Inference-Header-Content-Length",
                        "Inference-Header-Content-Length is %llu, but the body has %zu bytes",
                        (unsigned long long)v, len);
    *json_len = (size_t)v;
    return true;
}

static bool read_inputs(const codec_doc *doc, api_call *c, const codec_member *inputs,
                        const char *bytes, size_t n_bytes, api_error *err)
{
    const api_operation *o = c->op;
    if (*inputs->value != '[')
        return api_fail(err, 400, "wrong_type", "inputs", "inputs must be an array of tensors");
    oip_input in[API_MAX_FIELDS];
    codec_member entries[API_MAX_FIELDS];
    int n = 0;
    const char *p = codec_skip_ws(inputs->value + 1, inputs->value_end);
    while (p < inputs->value_end && *p != ']') {
        if (n == (int)o->n_fields)
            return api_fail(err, 400, "too_many_fields", "inputs",
                            "inputs has more entries than the model %s has inputs",
                            oip_model_name(o));
        entries[n] = (codec_member){.value = p,
                                    .value_end = codec_skip_value(p, inputs->value_end)};
        if (!read_input(o, &entries[n], n, &in[n], err))
            return false;
        for (int j = 0; j < n; j++)
            if (in[j].field == in[n].field)
                return api_fail(err, 400, "duplicate_key", o->fields[in[n].field].name,
                                "input %s is given twice", o->fields[in[n].field].name);
        p = codec_skip_ws(entries[n].value_end, inputs->value_end);
        if (p < inputs->value_end && *p == ',')
            p = codec_skip_ws(p + 1, inputs->value_end);
        n++;
    }
    /* The binary blocks, in the order of the inputs that have them, must be
     * the rest of the body exactly: judged before any is allocated. */
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        if (in[i].binary)
            total += in[i].size; /* each below 2^53: no overflow */
    if (total != n_bytes)
        return api_fail(err, 400, "invalid_framing", "inputs",
                        total > n_bytes
                            ? "the inputs' binary_data_size add up to %llu bytes, but %llu "
                              "follow the JSON text (Inference-Header-Content-Length): the "
                              "body is cut short"
                            : "the inputs' binary_data_size add up to %llu bytes, but %llu "
                              "follow the JSON text (Inference-Header-Content-Length): the "
                              "body is longer than its tensors",
                        (unsigned long long)total, (unsigned long long)n_bytes);
    for (size_t f = 0; f < o->n_fields; f++) {
        bool given = false;
        for (int i = 0; i < n; i++)
            given = given || in[i].field == (int)f;
        if (o->fields[f].required && oip_is_tensor(&o->fields[f]) && !given)
            return api_fail(err, 400, "missing_field", o->fields[f].name,
                            "the input \"%s\" is required", o->fields[f].name);
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        api_value *v = &c->f[in[i].field];
        bool ok = in[i].binary
                      ? decode_binary(o, &in[i], (const uint8_t *)bytes + at, &v->tensor, err)
                      : decode_json(doc, o, &in[i], &v->tensor, err);
        if (!ok)
            return false;
        v->present = true;
        if (in[i].binary)
            at += (size_t)in[i].size;
    }
    return true;
}

/* ----------------------------------------------------------- parameters */

static bool read_parameters(const codec_doc *doc, api_call *c, const codec_member *params,
                            api_error *err)
{
    const api_operation *o = c->op;
    codec_member m[API_MAX_FIELDS];
    size_t n = 0;
    if (!object_members(params, "parameters", m, API_MAX_FIELDS, &n, err))
        return false;
    for (size_t i = 0; i < n; i++) {
        const char *k = m[i].key_too_long ? "" : m[i].key;
        if (!strcmp(k, "binary_data_output")) {
            if (!bool_member(&m[i], "binary_data_output", &c->oip->binary_default, err))
                return false;
            continue;
        }
        int f = oip_field_index(o, k);
        if (f >= 0 && oip_is_tensor(&o->fields[f]))
            return api_fail(err, 400, "unknown_field", k,
                            "%s is a tensor: send it among the \"inputs\"", k);
        if (f >= 0 && o->fields[f].kind == API_FIELD_ENCODING)
            return api_fail(err, 400, "unknown_field", k,
                            "%s is /v1's; here each output is JSON data or binary "
                            "(\"binary_data_output\": true, or \"binary_data\" on an output)",
                            k);
        if (f < 0) {
            api_field names[API_MAX_FIELDS + 1];
            size_t kk = 0;
            for (size_t j = 0; j < o->n_fields; j++)
                if (!oip_is_tensor(&o->fields[j]) && o->fields[j].kind != API_FIELD_ENCODING)
                    names[kk++] = o->fields[j];
            names[kk++] = (api_field){"binary_data_output", API_FIELD_BOOL, false};
            char key[80];
            codec_member_key_shown(&m[i], key, sizeof key);
            const char *near = m[i].key_too_long ? NULL : api_nearest_field(k, names, kk);
            if (near)
                return api_fail(err, 400, "unknown_field", key,
                                "unknown parameter \"%s\" (did you mean \"%s\"?)", key, near);
            return api_fail(err, 400, "unknown_field", key,
                            "unknown parameter \"%s\"; the parameters are the fields of "
                            "/v1/%s that are not tensors, and binary_data_output", key,
                            oip_model_name(o));
        }
        if (*m[i].value == 'n')
            continue; /* null: the default, as on /v1 */
        if (!api_read_value(doc, &o->fields[f], &m[i], &c->f[f], err))
            return false;
        c->f[f].present = true;
    }
    return true;
}

/* -------------------------------------------------------------- outputs */

/* The return_* field an output asks for (or -1 when it asks for none). */
static int return_field(const api_operation *o, const char *output)
{
    char name[48];
    if (strcmp(output, "lse") && strcmp(output, "weights") && strcmp(output, "stats"))
        return -1;
    snprintf(name, sizeof name, "return_%s", output);
    return oip_field_index(o, name);
}

static bool read_outputs(api_call *c, const codec_member *outputs, api_error *err)
{
    api_oip *x = c->oip;
    if (*outputs->value != '[')
        return api_fail(err, 400, "wrong_type", "outputs",
                        "outputs must be an array of {\"name\": ...}");
    x->listed = true;
    const char *p = codec_skip_ws(outputs->value + 1, outputs->value_end);
    while (p < outputs->value_end && *p != ']') {
        char where[40];
        snprintf(where, sizeof where, "outputs[%d]", x->n_outputs);
        if (x->n_outputs == OIP_MAX_OUTPUTS)
            return api_fail(err, 400, "too_many_fields", "outputs",
                            "outputs has more than %d entries", OIP_MAX_OUTPUTS);
        codec_member entry = {.value = p, .value_end = codec_skip_value(p, outputs->value_end)};
        codec_member m[4];
        size_t n = 0;
        if (!object_members(&entry, where, m, 4, &n, err))
            return false;
        oip_output *out = &x->outputs[x->n_outputs];
        *out = (oip_output){.binary = -1};
        bool named = false;
        for (size_t i = 0; i < n; i++) {
            const char *k = m[i].key_too_long ? "" : m[i].key;
            if (!strcmp(k, "name")) {
                if (!string_member(&m[i], where, out->name, sizeof out->name, err))
                    return false;
                named = true;
            } else if (!strcmp(k, "parameters")) {
                codec_member pm[4];
                size_t np = 0;
                char pwhere[60];
                snprintf(pwhere, sizeof pwhere, "the parameters of %s", where);
                if (!object_members(&m[i], pwhere, pm, 4, &np, err))
                    return false;
                for (size_t j = 0; j < np; j++) {
                    bool b = false;
                    if (pm[j].key_too_long || strcmp(pm[j].key, "binary_data") != 0)
                        return unknown_member(&pm[j], pwhere, "binary_data", err);
                    if (!bool_member(&pm[j], "binary_data", &b, err))
                        return false;
                    out->binary = b;
                }
            } else {
                return unknown_member(&m[i], where, "name, parameters", err);
            }
        }
        if (!named)
            return api_fail(err, 400, "missing_field", where, "%s has no \"name\"", where);
        for (int j = 0; j < x->n_outputs; j++)
            if (!strcmp(x->outputs[j].name, out->name))
                return api_fail(err, 400, "duplicate_key", "outputs",
                                "the output %s is asked for twice", out->name);
        /* Asking for lse, weights or stats is asking for them to be computed. */
        int f = return_field(c->op, out->name);
        if (f >= 0) {
            api_value *v = &c->f[f];
            if (v->present && !v->flag)
                return api_fail(err, 422, "invalid_value", c->op->fields[f].name,
                                "outputs asks for %s, but the parameter %s is false",
                                out->name, c->op->fields[f].name);
            if (!v->present)
                *v = (api_value){.present = true, .flag = true};
        }
        x->n_outputs++;
        p = codec_skip_ws(entry.value_end, outputs->value_end);
        if (p < outputs->value_end && *p == ',')
            p = codec_skip_ws(p + 1, outputs->value_end);
    }
    /* A return_* parameter for an output the list leaves out would be
     * computed for nothing. */
    static const char *const asked[] = {"lse", "weights", "stats"};
    for (size_t i = 0; i < sizeof asked / sizeof *asked; i++) {
        int f = return_field(c->op, asked[i]);
        bool listed = false;
        for (int j = 0; j < x->n_outputs; j++)
            listed = listed || !strcmp(x->outputs[j].name, asked[i]);
        if (f >= 0 && c->f[f].present && c->f[f].flag && !listed)
            return api_fail(err, 422, "invalid_value", c->op->fields[f].name,
                            "the parameter %s asks for %s, which \"outputs\" does not list",
                            c->op->fields[f].name, asked[i]);
    }
    return true;
}

/* ---------------------------------------------------------------- read */

/* The request's members, in the validated document of its JSON text
 * [body, body + json_len); the binary data after it. */
static bool read_request(const codec_doc *doc, api_call *c, const char *body, size_t len,
                         size_t json_len, api_error *err)
{
    api_oip *x = c->oip;
    const char *end = body + json_len;
    const char *start = codec_skip_ws(body, end);
    if (start == end || *start != '{')
        return api_fail(err, 400, "wrong_type", "",
                        "the request must be a JSON object {\"inputs\": [...], ...}");
    codec_member m[8];
    size_t n = 0;
    codec_error ce;
    if (!codec_doc_members(doc, m, 8, &n, "", &ce))
        return api_fail_codec(err, &ce);
    const codec_member *id = NULL, *params = NULL, *inputs = NULL, *outputs = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *k = m[i].key_too_long ? "" : m[i].key;
        if (*m[i].value == 'n')
            continue; /* null: absent */
        if (!strcmp(k, "id")) id = &m[i];
        else if (!strcmp(k, "parameters")) params = &m[i];
        else if (!strcmp(k, "inputs")) inputs = &m[i];
        else if (!strcmp(k, "outputs")) outputs = &m[i];
        else
            return unknown_member(&m[i], "the request", "id, parameters, inputs, outputs",
                                  err);
    }
    if (id) {
        if (*id->value != '"')
            return api_fail(err, 400, "wrong_type", "id", "id must be a string");
        size_t n_id = (size_t)(id->value_end - id->value);
        if (!(x->id = malloc(n_id + 1)))
            return api_fail(err, 500, "out_of_memory", "id", "out of memory for the id");
        memcpy(x->id, id->value, n_id);
        x->id[n_id] = '\0';
    }
    if (!inputs)
        return api_fail(err, 400, "missing_field", "inputs", "the request has no \"inputs\"");
    return (!params || read_parameters(doc, c, params, err)) &&
           (!outputs || read_outputs(c, outputs, err)) &&
           read_inputs(doc, c, inputs, body + json_len, len - json_len, err);
}

bool api_oip_read(api_call *c, const char *body, size_t len, const char *json_length,
                  api_error *err)
{
    if (!(c->oip = calloc(1, sizeof *c->oip)))
        return api_fail(err, 500, "out_of_memory", "", "out of memory for this request");
    api_oip *x = c->oip;
    x->model = oip_model_name(c->op);
    size_t json_len = 0;
    if (!header_length(json_length, len, &json_len, err))
        return false;
    codec_span spans[8];
    codec_doc doc;
    codec_error ce;
    if (!codec_doc_validate(&doc, body, json_len, spans, 8, &ce))
        return api_fail_codec(err, &ce);
    bool ok = read_request(&doc, c, body, len, json_len, err);
    codec_doc_free(&doc);
    return ok;
}

