/*
 * Tensor codec speed: reading (codec_doc_validate then codec_doc_tensor, as
 * a request body is read) and writing (codec_tensor_encode) against
 * jansson's json_loadb / json_dumps on the same text.
 *
 *   codec COUNT
 *   codec small FILE [REPEATS]
 *
 * The text is a JSON array of COUNT random float32 values, each written the
 * way NumPy's repr writes a float32 (the shortest decimal that reads back to
 * the same float32), separated by ", " as Python's json.dumps does.
 * Our decode includes the validation, since a request body is validated
 * once before its tensors are read; its two steps are timed apart too
 * (validate: the strict check, which classifies the rows and notes them;
 * read: the numbers into float32). jansson reads with flags 0 and writes
 * with flags 0 (its defaults: 17 significant digits).
 * Each figure is the best of several repetitions after a warm-up; ours and
 * jansson's take turns, one repetition each, so that other work on the
 * machine hits both alike.
 *
 * `codec small FILE` times what a small request's body costs the codec, in
 * process: FILE is a JSON object of tensors (bench/bodies.py's small.json:
 * q, k, v [4, 4], nested); validate is codec_doc_validate (and
 * codec_doc_free), read is codec_doc_tensor of every member (and freeing
 * the tensors), write is codec_tensor_encode of the first member (16 floats
 * for small.json, as many as the answer's). Each is REPEATS (default 100000)
 * calls in a row, ten rounds taking turns, the best round's mean in ns.
 */
#include <float.h>
#include <stdbool.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json/codec.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Shortest "%.*g" text that reads back as exactly f, as repr(np.float32). */
static int shortest(char *out, size_t cap, float f)
{
    int len = 0;
    for (int digits = 1; digits <= 9; digits++) {
        len = snprintf(out, cap, "%.*g", digits, (double)f);
        if (strtof(out, NULL) == f)
            break;
    }
    return len;
}

/* Normal-ish float32 values, as a client's activations would be. */
static char *make_text(size_t count, size_t *len)
{
    size_t cap = count * 20 + 16;
    char *text = malloc(cap);
    if (text == NULL)
        return NULL;
    unsigned seed = 11;
    size_t at = 0;
    text[at++] = '[';
    for (size_t i = 0; i < count; i++) {
        float s = 0.0f;
        for (int j = 0; j < 4; j++)
            s += (float)rand_r(&seed) / (float)RAND_MAX - 0.5f;
        if (i > 0) {
            text[at++] = ',';
            text[at++] = ' ';
        }
        at += (size_t)shortest(text + at, cap - at, s * 1.7f);
    }
    text[at++] = ']';
    text[at] = '\0';
    *len = at;
    return text;
}

typedef struct {
    double decode_s, encode_s;
    double validate_s, read_s; /* ours: the two steps of decode_s */
    size_t encoded_len;
} timing;

/* One repetition of ours; the best times so far kept in *best unless
 * this is the warm-up. */
static int time_ours(const char *text, size_t len, bool warm_up, timing *best)
{
    {
        codec_error err;
        codec_tensor t;
        codec_doc doc;
        double t0 = now_s();
        bool ok = codec_doc_validate(&doc, text, len, NULL, 0, &err);
        double tv = now_s();
        ok = ok && codec_doc_tensor(&doc, text, text + len, "x", false, &t, &err);
        codec_doc_free(&doc);
        double t1 = now_s();
        if (!ok) {
            fprintf(stderr, "codec: decode: %s\n", err.message);
            return -1;
        }
        codec_buf b = {0};
        codec_tensor_encode(&b, t.f32, t.rank, t.shape, CODEC_ENC_NESTED);
        double t2 = now_s();
        if (b.failed) {
            fprintf(stderr, "codec: encode ran out of memory\n");
            return -1;
        }
        if (!warm_up) {
            best->decode_s = fmin(best->decode_s, t1 - t0);
            best->encode_s = fmin(best->encode_s, t2 - t1);
            best->validate_s = fmin(best->validate_s, tv - t0);
            best->read_s = fmin(best->read_s, t1 - tv);
        }
        best->encoded_len = b.len;
        codec_buf_free(&b);
        codec_tensor_free(&t);
    }
    return 0;
}

static int time_jansson(const char *text, size_t len, bool warm_up, timing *best)
{
    {
        json_error_t jerr;
        double t0 = now_s();
        json_t *root = json_loadb(text, len, 0, &jerr);
        double t1 = now_s();
        if (root == NULL) {
            fprintf(stderr, "codec: json_loadb: %s\n", jerr.text);
            return -1;
        }
        char *out = json_dumps(root, 0);
        double t2 = now_s();
        if (out == NULL) {
            fprintf(stderr, "codec: json_dumps failed\n");
            return -1;
        }
        if (!warm_up) {
            best->decode_s = fmin(best->decode_s, t1 - t0);
            best->encode_s = fmin(best->encode_s, t2 - t1);
        }
        best->encoded_len = strlen(out);
        free(out);
        json_decref(root);
    }
    return 0;
}

/* Our decode then encode must give back the same float32 values. */
static int check_round_trip(const char *text, size_t len)
{
    codec_error err;
    codec_tensor a, b;
    if (!codec_tensor_decode(text, text + len, "x", false, &a, &err))
        return -1;
    codec_buf buf = {0};
    codec_tensor_encode(&buf, a.f32, a.rank, a.shape, CODEC_ENC_NESTED);
    int rc = -1;
    if (!buf.failed &&
        codec_tensor_decode(buf.data, buf.data + buf.len, "x", false, &b, &err)) {
        rc = b.count == a.count &&
                     memcmp(a.f32, b.f32, (size_t)a.count * sizeof(float)) == 0
                 ? 0
                 : -1;
        codec_tensor_free(&b);
    }
    codec_buf_free(&buf);
    codec_tensor_free(&a);
    return rc;
}

static int small_body(const char *path, long repeats)
{
    static char text[1 << 16];
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        return 1;
    }
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    enum { MAX_MEMBERS = 8 };
    codec_doc doc;
    codec_span spans[MAX_MEMBERS];
    codec_error err;
    if (!codec_doc_validate(&doc, text, len, spans, MAX_MEMBERS, &err)) {
        fprintf(stderr, "codec: %s: %s\n", path, err.message);
        return 1;
    }
    size_t members = doc.members < MAX_MEMBERS ? doc.members : MAX_MEMBERS;
    codec_tensor first;
    if (members == 0 ||
        !codec_doc_tensor(&doc, spans[0].value, spans[0].value_end, "x", false, &first, &err)) {
        fprintf(stderr, "codec: %s: no tensor to read first\n", path);
        return 1;
    }
    double best[3] = {INFINITY, INFINITY, INFINITY};
    for (int r = 0; r <= 10; r++) { /* r == 0 is the warm-up */
        double t0 = now_s();
        for (long i = 0; i < repeats; i++) {
            codec_doc d;
            if (!codec_doc_validate(&d, text, len, spans, MAX_MEMBERS, &err))
                return 1;
            codec_doc_free(&d);
        }
        double t1 = now_s();
        for (long i = 0; i < repeats; i++)
            for (size_t m = 0; m < members; m++) {
                codec_tensor t;
                if (!codec_doc_tensor(&doc, spans[m].value, spans[m].value_end, "x", false, &t,
                                      &err))
                    return 1;
                codec_tensor_free(&t);
            }
        double t2 = now_s();
        for (long i = 0; i < repeats; i++) {
            codec_buf b = {0};
            codec_tensor_encode(&b, first.f32, first.rank, first.shape, CODEC_ENC_NESTED);
            if (b.failed)
                return 1;
            codec_buf_free(&b);
        }
        double t3 = now_s();
        if (r == 0)
            continue;
        double t[3] = {t1 - t0, t2 - t1, t3 - t2};
        for (int k = 0; k < 3; k++)
            if (t[k] < best[k])
                best[k] = t[k];
    }
    printf("body_bytes %zu\n", len);
    printf("tensors %zu\n", members);
    printf("validate_ns %.0f\n", best[0] * 1e9 / (double)repeats);
    printf("read_ns %.0f\n", best[1] * 1e9 / (double)repeats);
    printf("write_ns %.0f\n", best[2] * 1e9 / (double)repeats);
    codec_tensor_free(&first);
    codec_doc_free(&doc);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "small") == 0)
        return small_body(argv[2], argc >= 4 ? atol(argv[3]) : 100000);
    size_t count = argc == 2 ? (size_t)atol(argv[1]) : 1000000;
    size_t len;
    char *text = make_text(count, &len);
    if (text == NULL) {
        fprintf(stderr, "codec: out of memory\n");
        return 1;
    }
    timing ours = {INFINITY, INFINITY, INFINITY, INFINITY, 0},
           theirs = {INFINITY, INFINITY, INFINITY, INFINITY, 0};
    for (int r = 0; r <= 9; r++) /* r == 0 is the warm-up */
        if (time_ours(text, len, r == 0, &ours) != 0 ||
            time_jansson(text, len, r == 0, &theirs) != 0)
            return 1;
    if (check_round_trip(text, len) != 0) {
        fprintf(stderr, "codec: decode(encode(x)) != x\n");
        return 1;
    }
    double mb = 1e-6;
    printf("count %zu\n", count);
    printf("text_bytes %zu\n", len);
    printf("ours_decode_s %.6f\n", ours.decode_s);
    printf("ours_encode_s %.6f\n", ours.encode_s);
    printf("ours_encoded_bytes %zu\n", ours.encoded_len);
    printf("ours_decode_mbs %.1f\n", (double)len * mb / ours.decode_s);
    printf("ours_validate_ns_per_number %.2f\n", ours.validate_s * 1e9 / (double)count);
    printf("ours_read_ns_per_number %.2f\n", ours.read_s * 1e9 / (double)count);
    printf("ours_decode_ns_per_number %.2f\n", ours.decode_s * 1e9 / (double)count);
    printf("ours_encode_mbs %.1f\n", (double)ours.encoded_len * mb / ours.encode_s);
    printf("jansson_decode_s %.6f\n", theirs.decode_s);
    printf("jansson_encode_s %.6f\n", theirs.encode_s);
    printf("jansson_encoded_bytes %zu\n", theirs.encoded_len);
    printf("jansson_decode_mbs %.1f\n", (double)len * mb / theirs.decode_s);
    printf("jansson_encode_mbs %.1f\n", (double)theirs.encoded_len * mb / theirs.encode_s);
    printf("ratio %.2f\n", (theirs.decode_s + theirs.encode_s) /
                               (ours.decode_s + ours.encode_s));
    free(text);
    return 0;
}
