/*
 * What libattn says about itself, handed to the server for /v1/info and
 * --version (server/ does not include lib/).
 */
#include "api.h"
#include "attn.h"

void api_get_info(api_info *info)
{
    info->libattn = attn_version();
    info->kernel = attn_kernel_name();
    info->blas_config = attn_blas_config();
    info->blas_corename = attn_blas_corename();
}
