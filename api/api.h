/*
 * The API layer: JSON request bodies in, JSON response bodies out.
 * It validates, decodes tensors, calls libattn and encodes the answer; it
 * knows nothing of sockets (server/ owns the transport) and nothing of
 * softmax (lib/ owns the numbers).
 *
 * Every step that can fail fills one api_error (HTTP status, short code,
 * message a person can act on, offending field); api_error_json() turns it
 * into the body {"error": {...}} in exactly one place.
 */
#ifndef API_H
#define API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int status;        /* HTTP status: 400, 404, 405, 413, 415, 422, 500, 503 */
    char code[40];     /* short machine-readable code, e.g. "shape_mismatch" */
    char message[300]; /* e.g. "k has d_k=32 but q has d_k=64" */
    char field[64];    /* the request field at fault, "" when none */
} api_error;

/* Fills e (status, code, field, printf-style message) and returns false, so
 * that a failing step can `return api_fail(err, ...)`. */
bool api_fail(api_error *e, int status, const char *code, const char *field,
              const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* {"error": {"status": ..., "code": ..., "message": ..., "field": ...}}
 * (field omitted when empty). Returns a malloc'd NUL-terminated string, or
 * NULL when out of memory; *len gets its length. */
char *api_error_json(const api_error *e, size_t *len);

typedef enum {
    API_OP_ATTENTION = 0, /* POST /v1/attention */
    API_OP_MULTIHEAD = 1, /* POST /v1/multihead */
} api_op;

/* Per-request limits and resources, decided by the server. */
typedef struct {
    double max_work; /* FLOPs; a request needing more is a 422 (work_limit) */
    int threads;     /* libattn threads for this request (>= 1) */
} api_limits;

typedef struct {
    int status;       /* 200, or the error's status */
    char *body;       /* malloc'd JSON (the answer or the error object) */
    size_t body_len;
    double decode_ms, compute_ms, encode_ms; /* 0 for the steps not reached */
} api_response;

/*
 * Handles one request body of `len` bytes (not NUL-terminated) for `op`.
 * Always fills `res` (a 200 answer or an error body); never aborts. On an
 * allocation failure the answer is a 500 with code "out_of_memory" (or, if
 * even that cannot be built, body == NULL and status 500).
 * meta.timing_ms.total in the body is decode + compute + encode; the server
 * adds its own time in the Server-Timing header.
 */
void api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                api_response *res);

void api_response_free(api_response *res);

/* What the server reports about the computation in /v1/info and
 * --version, so that server/ never reaches into lib/. The strings are
 * libattn's and live as long as the process. */
typedef struct {
    const char *libattn;       /* libattn's version */
    const char *kernel;        /* the attention micro-kernel in use: "avx2", ... */
    const char *blas_config;   /* OpenBLAS's build configuration */
    const char *blas_corename; /* the OpenBLAS kernel chosen for this CPU */
    /* NULL, or one sentence when OpenBLAS runs narrower kernels than the CPU
     * has (attn_blas_shortfall): what it costs, how OPENBLAS_CORETYPE changes it. */
    const char *blas_shortfall;
} api_info;

void api_get_info(api_info *info);

/* api/openapi.yaml, embedded at build time (build/openapi_yaml.c). */
extern const char api_openapi_yaml[];
extern const size_t api_openapi_yaml_len;

#endif /* API_H */
