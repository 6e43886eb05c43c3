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

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int status;        /* HTTP status: 400, 404, 405, 413, 415, 422, 499, 500, 503 */
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

/* The same error as the Open Inference Protocol writes it: {"error":
 * "message"} (the message names the field at fault). Same contract. */
char *api_error_json_oip(const api_error *e, size_t *len);

typedef enum {
    API_OP_ATTENTION = 0,       /* POST /v1/attention */
    API_OP_MULTIHEAD = 1,       /* POST /v1/multihead */
    API_OP_CACHE_ATTENTION = 2, /* POST /v1/caches/{id}/attention */
} api_op;

/*
 * The KV caches of a server (api/cache_store.c): keys and values kept
 * between requests, so that decoding attends over what earlier requests
 * appended. One store per server, shared by every thread; `memory` bytes
 * bound every cache together, and a cache unused for `idle_seconds` is
 * dropped (<= 0: never).
 */
typedef struct api_caches api_caches;

api_caches *api_caches_new(double memory, double idle_seconds);
void api_caches_free(api_caches *s); /* with every cache it holds */

typedef struct {
    int64_t caches;          /* held now */
    double bytes;            /* what they hold together */
    uint64_t evicted_memory; /* dropped to make room, since the start */
    uint64_t evicted_idle;   /* dropped after --cache-idle */
} api_caches_stats;

/* Also drops the caches idle for too long first. */
void api_caches_stats_get(api_caches *s, api_caches_stats *st);

/* Per-request limits and resources, decided by the server. */
typedef struct {
    double max_work;     /* work units (api_cost.work); more is a 422 work_limit;
                          * <= 0: no limit */
    double max_response; /* bytes; an answer that could be larger is a 422
                          * response_too_large; <= 0: no limit */
    double max_memory;   /* bytes a request may hold at its peak (api_cost.memory);
                          * more is a 422 memory_limit; <= 0: no limit */
    int threads;         /* libattn threads for this request (>= 1) */
    int max_threads;     /* the most libattn threads it may be given when it runs
                          * (its workspaces are judged for that many); < threads:
                          * threads */
    double arrival_ms;   /* when the request arrived, on api_now_ms's clock
                          * (CLOCK_MONOTONIC, ms): meta.timing_ms.total counts
                          * from it; 0: total is decode + compute + encode */
    /* The cache routes: the store, the id from the path, and who asks (the
     * API key, NULL without keys): a cache answers only the key that made it. */
    api_caches *caches;
    const char *cache_id;
    const char *owner;
    const atomic_int *cancel; /* NULL, or a flag the server sets once nobody
                          * waits for the answer: libattn stops between units
                          * of work and the answer is the error 499 cancelled */
} api_limits;

/*
 * What a request costs, judged from its shapes before anything is computed.
 *
 * `work` is in FLOP-equivalents: the nominal FLOPs of the products, plus
 * every other cost that grows with the request (each (batch, head) pair and
 * each query row, each score's exponential and mask, the statistics, the
 * materialised weights, the projections' product calls, the decoding of the
 * body and the encoding of the answer), each priced as the FLOPs libattn's
 * attention kernel does in the same time (api/cost.c has the prices and how
 * they were measured). So --max-work bounds time, whatever the shapes.
 */
typedef struct {
    double flops;          /* nominal FLOPs of the products (meta.flops) */
    double work;           /* everything, in FLOP-equivalents (meta.work) */
    double response_bytes; /* the most bytes the answer can take */
    /* The most bytes the request holds at once, from its arrival to its
     * answer: its body, its decoded inputs, its results, libattn's
     * workspaces (projections, packed keys, per-worker tiles, per-head
     * buffers) and the answer's text. */
    double memory;
} api_cost;

/* The most blocks an answer has: one per output. */
#define API_MAX_BLOCKS 24

/* A block of an answer's bytes beyond its body (api_response.blocks). */
typedef struct {
    void *data;       /* the allocator's of api_set_allocator (api_body_free); the
                       * response owns it */
    size_t len;
} api_block;

typedef struct {
    int status;       /* 200, or the error's status */
    char *body;       /* JSON (the answer or the error object): malloc'd, or, with
                       * body_elements, the allocator's of api_set_allocator
                       * (api_body_free); api_response_free knows which */
    bool body_elements;
    size_t body_len;
    size_t body_cap;  /* bytes the body holds in memory (>= body_len + 1) */
    double decode_ms, compute_ms, encode_ms; /* 0 for the steps not reached */
    double total_ms;  /* meta.timing_ms.total (for an error: as it would be) */
    char error_code[40]; /* the error's code when status is not 200, else "" */
    char location[96];   /* a Location header to send ("" for none): a 201's */
    int retry_after;     /* seconds for a Retry-After header (0: none) */
    /* The Open Inference Protocol's binary outputs: the answer is header_len
     * bytes of JSON text (the value of the Inference-Header-Content-Length
     * header), then raw tensor bytes. 0: the answer is all JSON. The body
     * holds the JSON text; the raw bytes follow in `blocks`, one per binary
     * output in the order of the outputs, each sent as it lies (a float32
     * result is the very array it was computed into: no copy of megabytes
     * into fresh pages to send it). */
    size_t header_len;
    api_block *blocks;   /* malloc'd [n_blocks], or NULL */
    int n_blocks;
} api_response;

/*
 * A request in two halves, so that the server can decide what to do with
 * it (compute it at once, queue it, or refuse it) from its cost:
 *
 *   api_prepare   decode, validate, cost: reads the body (which it no longer
 *                 needs afterwards) into a call, or fills `res` with the
 *                 error answer (400, 422 ...) and returns NULL. Nothing is
 *                 computed; the work limit and the response limit of `lim`
 *                 are applied here.
 *   api_execute   compute, encode: always fills `res` (the 200 answer or an
 *                 error body) and frees the call. `threads` is the number of
 *                 libattn threads it may use (>= 1).
 *
 * A prepared call that will not be executed is freed by api_call_free.
 * Neither aborts; on an allocation failure the answer is a 500 with code
 * "out_of_memory" (or, if even that cannot be built, body == NULL and status
 * 500). meta.timing_ms.total in the body is the time since lim->arrival_ms
 * (decode + compute + encode without one), rounded to the microsecond, and
 * is res->total_ms, so that a header can repeat the same figure.
 */
typedef struct api_call api_call;

api_call *api_prepare(api_op op, const char *body, size_t len, const api_limits *lim,
                      api_cost *cost, api_response *res);
void api_execute(api_call *call, int threads, api_response *res);
void api_call_free(api_call *call);

/* api_execute, only if the call would not wait for another request (for a
 * KV cache, its turn held or awaited by another): true when it ran (res
 * filled, the call freed), false when nothing was done and the call is
 * still the caller's. For a thread that must not wait, such as the one
 * serving connections. */
bool api_execute_now(api_call *call, int threads, api_response *res);

/*
 * api_prepare for the Open Inference Protocol (KServe v2): the body of
 * POST /v2/models/{attention|multihead}/infer, whose JSON text ends where
 * json_length (the Inference-Header-Content-Length value as received, NULL
 * when absent) says, binary tensors after it. The same call as /v1's, with
 * the same checks and costs; api_execute answers it in the protocol's form
 * and its errors are {"error": "message"} (api_error_json_oip).
 *
 * Unlike api_prepare, it may keep pointing into the body: binary FP32 and
 * BOOL inputs are read where they lie (no copy of a large tensor), so the
 * body must stay alive and unchanged until the call is executed or freed.
 * An FP32 input not aligned for a float is copied.
 */
api_call *api_prepare_oip(api_op op, const char *body, size_t len, const char *json_length,
                          const api_limits *lim, api_cost *cost, api_response *res);

/* GET /v2/models/{model}: the model's metadata (its inputs and outputs,
 * datatypes, -1 for dimensions of any size), malloc'd JSON; NULL when out
 * of memory. */
char *api_oip_model_metadata(api_op op, size_t *len);

/* The bytes a prepared call's decoded input tensors hold until it is
 * executed or freed: 4 per float32 element, 2 per bfloat16 element kept as
 * sent (q, k, v and grad_output of /v1/attention in bfloat16 precision),
 * 1 per boolean. */
size_t api_call_input_bytes(const api_call *call);

/* The work of decoding a body of `len` bytes, known before it is read: the
 * part of api_cost.work that api_prepare itself spends. */
double api_decode_work(size_t len);

/* Both halves at once, with lim->threads. */
void api_handle(api_op op, const char *body, size_t len, const api_limits *lim,
                api_response *res);

void api_response_free(api_response *res);
/* Frees a body taken over from an api_response with body_elements set. */
void api_body_free(void *body);

/* Where the large blocks of a computation come from: the decoded tensors
 * (codec_set_allocator), libattn's workspaces (attn_set_allocator) and the
 * results they are written into. By default malloc, realloc and free.
 * alloc returns `bytes` bytes aligned to 64, or NULL; realloc is realloc's
 * equal; free takes what they gave, or NULL; all thread-safe. Set once,
 * before the first request, and kept (NULL: the default again). */
typedef struct {
    void *(*alloc)(void *ctx, size_t bytes);
    void *(*realloc)(void *ctx, void *p, size_t bytes);
    void (*free)(void *ctx, void *p);
    void *ctx;
} api_allocator;
void api_set_allocator(const api_allocator *a);

/* No computation follows soon on this thread (a server's worker whose
 * queue is empty): libattn's helper threads stop polling for one and block
 * now, leaving their cores to others (attn_threads_rest). */
void api_threads_rest(void);

/* The bytes of the answer: body_len and every block's. */
size_t api_response_bytes(const api_response *res);

/*
 * The cache routes other than attention, cheap enough to answer at once:
 *   POST /v1/caches          201 and the cache's object, Location set
 *   GET /v1/caches/{id}      200 and the object
 *   DELETE /v1/caches/{id}   204, no body (res->body NULL, body_len 0)
 * lim->caches, lim->cache_id and lim->owner say which cache, for whom. For
 * POST, lim->cache_id (NULL or "": 128 random bits) is the id to give the
 * new cache: a load balancer that routes /v1/caches/{id} by a hash of the
 * id chooses it, so that the cache is made on the replica its id leads to.
 */
void api_cache_create(const char *body, size_t len, const api_limits *lim, api_response *res);
void api_cache_get(const api_limits *lim, api_response *res);
void api_cache_delete(const api_limits *lim, api_response *res);

/* What the server reports about the computation in /v1/info and
 * --version, so that server/ never reaches into lib/. The strings are
 * libattn's and live as long as the process. */
typedef struct {
    const char *libattn;       /* libattn's version */
    const char *kernel;        /* the attention micro-kernel in use: "avx2", ... */
    const char *bf16;          /* how bfloat16 products run: "avx512_bf16", "emulated" */
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
/* The same contract as JSON (build/openapi.json, converted at build time by
 * tools/yaml2json.c). */
extern const char api_openapi_json[];
extern const size_t api_openapi_json_len;

#endif /* API_H */
