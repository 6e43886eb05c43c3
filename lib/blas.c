/* OpenBLAS configuration. libattn runs its own threads over independent
 * tiles (attn_parallel_for), each calling sgemm on a small tile; a threaded
 * BLAS underneath would oversubscribe the cores, so OpenBLAS is kept at one
 * thread, set once per process before the first BLAS call. */
#include <pthread.h>

#include <cblas.h>

#include "internal.h"

static pthread_once_t blas_once = PTHREAD_ONCE_INIT;

static void blas_single_threaded(void)
{
    openblas_set_num_threads(1);
}

void attn_blas_init(void)
{
    pthread_once(&blas_once, blas_single_threaded);
}

const char *attn_blas_config(void)
{
    return openblas_get_config();
}

const char *attn_blas_corename(void)
{
    return openblas_get_corename();
}
