/* What libattn is: its version, for /v1/info and --version. */
#include "attn.h"

const char *attn_version(void)
{
    return "1.0.0";
}
