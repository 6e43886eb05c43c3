/*
 * What libattn says about itself, handed to the server for /v1/info and
 * --version (server/ does not include lib/).
 */
#include <pthread.h>

#include "api.h"
#include "attn.h"

static char shortfall[400];
static bool has_shortfall;
static pthread_once_t shortfall_once = PTHREAD_ONCE_INIT;

static void find_shortfall(void)
{
    has_shortfall = attn_blas_shortfall(attn_blas_corename(), attn_cpu_features(), shortfall,
                                        sizeof shortfall);
}

void api_get_info(api_info *info)
{
    pthread_once(&shortfall_once, find_shortfall);
    info->libattn = attn_version();
    info->kernel = attn_kernel_name();
    info->bf16 = attn_bf16_name();
    info->blas_config = attn_blas_config();
    info->blas_corename = attn_blas_corename();
    info->blas_shortfall = has_shortfall ? shortfall : NULL;
}
