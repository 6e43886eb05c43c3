/* Everything an SDPA entry point decides before touching a tensor: whether
 * the parameters fit together, how many FLOPs the call is worth, how many
 * threads that justifies. */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "sdpa.h"

float attn_default_scale(int64_t d_k)
{
    return d_k >= 1 ? (float)(1.0 / sqrt((double)d_k)) : 1.0f;
}

/* The (query, key) pairs of sequence c's block: all of them, or with a
 * window the band it leaves each row (causal included then: the band the
 * kernels visit). */
static double block_pairs(const sdpa_call *c)
{
    const int64_t n_q = c->q_hi - c->q_lo, n_k = c->k_hi - c->k_lo;
    if (!c->p->variants.window || n_q == 0 || n_k == 0)
        return (double)n_q * (double)n_k;
    double pairs = 0.0;
    for (int64_t i = c->q_lo; i < c->q_hi; i++) {
        int64_t lo, hi;
        sdpa_row_range(c, i, c->k_lo, n_k, &lo, &hi);
        pairs += (double)(hi - lo);
    }
    return pairs;
}

double attn_sdpa_flops(const attn_sdpa_params *p)
{
    if (p == NULL)
        return 0.0;
    const sdpa_call call = sdpa_call_of(p, NULL, NULL, NULL);
    double pairs = 0.0;
    if (p->ragged.seqs > 0 && p->ragged.cu_seqlens_q != NULL) {
        for (int64_t s = 0; s < p->ragged.seqs; s++) {
            int64_t b;
            const sdpa_call c = sdpa_call_seq(&call, s, &b);
            pairs += block_pairs(&c);
        }
    } else {
        pairs = (double)p->batch * block_pairs(&call);
    }
    return 2.0 * (double)p->heads_q * pairs * (double)(p->d_k + p->d_v);
}

/* Elements of a tensor with these dimensions, or -1 when the count (or its
 * size in bytes) does not fit. */
static int64_t elements(int64_t a, int64_t b, int64_t c, int64_t d)
{
    int64_t n;
    if (__builtin_mul_overflow(a, b, &n) || __builtin_mul_overflow(n, c, &n) ||
        __builtin_mul_overflow(n, d, &n) || n > INT64_MAX / 8)
        return -1;
    return n;
}

static attn_status check_mask(const attn_sdpa_params *p, attn_error *err)
{
    const attn_mask *m = &p->mask;
    if (m->kind == ATTN_MASK_NONE)
        return ATTN_OK;
    if (m->kind != ATTN_MASK_BOOL && m->kind != ATTN_MASK_BIAS)
        return attn_fail(err, ATTN_ERR_INVALID, "mask kind %d is not a known kind",
                         (int)m->kind);
    if (m->kind == ATTN_MASK_BOOL && m->allowed == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "boolean mask has no data (allowed is NULL)");
    if (m->kind == ATTN_MASK_BIAS && m->bias == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "bias mask has no data (bias is NULL)");
    const int64_t dims[4] = {p->batch, p->heads_q, p->n_q, p->n_k};
    int64_t last = 0; /* index of the mask's last element */
    for (int a = 0; a < 4; a++) {
        int64_t span;
        if (m->stride[a] < 0)
            return attn_fail(err, ATTN_ERR_INVALID, "mask stride %d is negative (%lld)",
                             a, (long long)m->stride[a]);
        if (__builtin_mul_overflow(dims[a] - 1, m->stride[a], &span) ||
            __builtin_add_overflow(last, span, &last))
            return attn_fail(err, ATTN_ERR_INVALID, "mask strides address beyond int64");
    }
    if (last > INT64_MAX / 8)
        return attn_fail(err, ATTN_ERR_INVALID, "mask strides address beyond int64");
    return ATTN_OK;
}

/* cu [seqs + 1] of a ragged batch: from 0 to n, never decreasing. */
static attn_status check_offsets(const char *name, const int64_t *cu, int64_t seqs, int64_t n,
                                 const char *n_name, attn_error *err)
{
    if (cu == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "%s is NULL with %lld sequences", name,
                         (long long)seqs);
    if (cu[0] != 0)
        return attn_fail(err, ATTN_ERR_INVALID, "%s[0] is %lld; it must be 0", name,
                         (long long)cu[0]);
    for (int64_t s = 0; s < seqs; s++)
        if (cu[s + 1] < cu[s])
            return attn_fail(err, ATTN_ERR_INVALID,
                             "%s decreases from %lld to %lld at sequence %lld (a negative "
                             "length)",
                             name, (long long)cu[s], (long long)cu[s + 1], (long long)s);
    if (cu[seqs] != n)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "%s ends at %lld but %s is %lld: the sequences must cover every row",
                         name, (long long)cu[seqs], n_name, (long long)n);
    return ATTN_OK;
}

static attn_status check_ragged(const attn_sdpa_params *p, attn_error *err)
{
    const attn_ragged *r = &p->ragged;
    if (r->seqs == 0)
        return ATTN_OK;
    if (r->seqs < 0)
        return attn_fail(err, ATTN_ERR_INVALID, "ragged.seqs is %lld; it must be >= 0",
                         (long long)r->seqs);
    if (p->batch != 1)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "a ragged batch packs its sequences along the rows: batch must be "
                         "1, not %lld",
                         (long long)p->batch);
    attn_status s = check_offsets("cu_seqlens_q", r->cu_seqlens_q, r->seqs, p->n_q, "n_q", err);
    if (s == ATTN_OK)
        s = r->cu_seqlens_k != NULL
                ? check_offsets("cu_seqlens_k", r->cu_seqlens_k, r->seqs, p->n_k, "n_k", err)
                : check_offsets("cu_seqlens_q (for the keys: cu_seqlens_k is NULL)",
                                r->cu_seqlens_q, r->seqs, p->n_k, "n_k", err);
    return s;
}

static attn_status check_variants(const attn_sdpa_params *p, attn_error *err)
{
    const attn_variants *v = &p->variants;
    if (v->window && (v->window_left < -1 || v->window_right < -1))
        return attn_fail(err, ATTN_ERR_INVALID,
                         "window [%lld, %lld]: each side must be >= 0, or -1 for unbounded",
                         (long long)v->window_left, (long long)v->window_right);
    if (!isfinite(v->softcap) || v->softcap < 0.0f)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "softcap is %g; it must be finite and > 0 (0: none)", (double)v->softcap);
    if (!isfinite(v->rope_base) || v->rope_base < 0.0f)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "rope_base is %g; it must be finite and > 0 (0: none)",
                         (double)v->rope_base);
    if (v->rope_base > 0.0f && p->d_k % 2 != 0)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "rotary embedding needs an even d_k (pairs of features); d_k is %lld",
                         (long long)p->d_k);
    if (v->alibi_slopes != NULL && v->alibi_batch_stride != 0 &&
        v->alibi_batch_stride != p->heads_q)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "alibi_batch_stride is %lld; it must be 0 ([H_q] slopes) or H_q = %lld "
                         "([B, H_q])",
                         (long long)v->alibi_batch_stride, (long long)p->heads_q);
    if (v->alibi_slopes != NULL) {
        int64_t n = v->alibi_batch_stride == 0 ? p->heads_q : p->batch * p->heads_q;
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(v->alibi_slopes[i]))
                return attn_fail(err, ATTN_ERR_INVALID, "ALiBi slope %lld is not finite",
                                 (long long)i);
    }
    return ATTN_OK;
}

attn_status sdpa_check_params(const attn_sdpa_params *p, bool with_weights,
                              attn_error *err)
{
    attn_status s;
    if (p == NULL)
        return attn_fail(err, ATTN_ERR_INVALID, "parameters are NULL");
    const struct {
        const char *name;
        int64_t value;
    } sizes[] = {
        {"batch", p->batch}, {"heads_q", p->heads_q}, {"heads_kv", p->heads_kv},
        {"n_q", p->n_q},     {"n_k", p->n_k},         {"d_k", p->d_k},
        {"d_v", p->d_v},
    };
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].value < 1)
            return attn_fail(err, ATTN_ERR_INVALID, "%s is %lld; it must be >= 1",
                             sizes[i].name, (long long)sizes[i].value);
    if (p->heads_q % p->heads_kv != 0)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "heads_q = %lld is not a multiple of heads_kv = %lld",
                         (long long)p->heads_q, (long long)p->heads_kv);
    if (!isfinite(p->scale) || !(p->scale > 0.0f))
        return attn_fail(err, ATTN_ERR_INVALID, "scale is %g; it must be finite and > 0",
                         (double)p->scale);
    if (p->threads < 1)
        return attn_fail(err, ATTN_ERR_INVALID, "threads is %d; it must be >= 1",
                         p->threads);
    if (p->layout != ATTN_LAYOUT_BHND && p->layout != ATTN_LAYOUT_BNHD)
        return attn_fail(err, ATTN_ERR_INVALID, "layout %d is not a known layout",
                         (int)p->layout);
    if (p->precision != ATTN_PRECISION_FLOAT32 && p->precision != ATTN_PRECISION_BFLOAT16)
        return attn_fail(err, ATTN_ERR_INVALID, "precision %d is not a known precision",
                         (int)p->precision);
    const attn_dtype dtypes[] = {p->dtype.q, p->dtype.k, p->dtype.v, p->dtype.dout};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (dtypes[i] != ATTN_DTYPE_FLOAT32 && dtypes[i] != ATTN_DTYPE_BFLOAT16)
            return attn_fail(err, ATTN_ERR_INVALID, "dtype %d is not a known dtype",
                             (int)dtypes[i]);
        /* float32 products of bfloat16 inputs would want the widened copy
         * these inputs exist to avoid: the caller widens instead. */
        if (dtypes[i] == ATTN_DTYPE_BFLOAT16 && p->precision != ATTN_PRECISION_BFLOAT16)
            return attn_fail(err, ATTN_ERR_INVALID,
                             "bfloat16 inputs need precision bfloat16");
    }
    s = check_variants(p, err);
    if (s == ATTN_OK)
        s = check_ragged(p, err);
    if (s != ATTN_OK)
        return s;
    if (elements(p->batch, p->heads_q, p->n_q, p->d_k) < 0 ||
        elements(p->batch, p->heads_q, p->n_q, p->d_v) < 0 ||
        elements(p->batch, p->heads_kv, p->n_k, p->d_k) < 0 ||
        elements(p->batch, p->heads_kv, p->n_k, p->d_v) < 0)
        return attn_fail(err, ATTN_ERR_INVALID, "tensor sizes overflow");
    /* The forward's packed copy of k pads n_k to whole key tiles. */
    if (elements(p->batch, p->heads_kv, p->n_k + 64, p->d_k) < 0)
        return attn_fail(err, ATTN_ERR_INVALID, "tensor sizes overflow");
    if (with_weights &&
        elements(p->batch, p->weights_mean ? 1 : p->heads_q, p->n_q, p->n_k) < 0)
        return attn_fail(err, ATTN_ERR_INVALID,
                         "weights [%lld, %lld, %lld, %lld] would overflow",
                         (long long)p->batch, (long long)p->heads_q,
                         (long long)p->n_q, (long long)p->n_k);
    return check_mask(p, err);
}

bool sdpa_dtypes_float32(const attn_sdpa_params *p)
{
    return p->dtype.q == ATTN_DTYPE_FLOAT32 && p->dtype.k == ATTN_DTYPE_FLOAT32 &&
           p->dtype.v == ATTN_DTYPE_FLOAT32 && p->dtype.dout == ATTN_DTYPE_FLOAT32;
}

int sdpa_threads(const attn_sdpa_params *p, int64_t units, double flops)
{
    if (flops < SDPA_MIN_PARALLEL_FLOPS || units <= 1)
        return 1;
    int64_t threads = p->threads < SDPA_MAX_THREADS ? p->threads : SDPA_MAX_THREADS;
    return (int)(units < threads ? units : threads);
}

/* The allocator of attn_set_allocator; a.alloc NULL: the default. Set
 * before any call runs (attn.h), read by every call after. */
static attn_allocator workspaces;

void attn_set_allocator(const attn_allocator *a)
{
    workspaces = a && a->alloc && a->free ? *a : (attn_allocator){0};
}

void *sdpa_alloc(int64_t n, size_t size)
{
    /* Rounded up to whole cache lines, as aligned_alloc requires. */
    if (n < 1)
        n = 1;
    if ((uint64_t)n > SIZE_MAX / size - 64)
        return NULL;
    size_t bytes = ((size_t)n * size + 63) / 64 * 64;
    if (workspaces.alloc)
        return workspaces.alloc(workspaces.ctx, bytes);
    void *p = aligned_alloc(64, bytes);
#ifdef MADV_HUGEPAGE
    /* A large workspace (the packed keys of a long or ragged batch, dq's
     * copies) is mapped anew by malloc at each call, and first touching it
     * page by page costs a fault per 4 KiB, microseconds each on a virtual
     * machine: it is asked to be backed by 2 MiB pages where the kernel
     * has them (advice only). */
    const uintptr_t huge = (uintptr_t)2 << 20;
    if (p != NULL && bytes >= 2 * huge) {
        uintptr_t from = ((uintptr_t)p + huge - 1) & ~(huge - 1);
        uintptr_t to = ((uintptr_t)p + bytes) & ~(huge - 1);
        (void)madvise((void *)from, to - from, MADV_HUGEPAGE);
    }
#endif
    return p;
}

void sdpa_free(void *p)
{
    if (workspaces.free)
        workspaces.free(workspaces.ctx, p);
    else
        free(p);
}
