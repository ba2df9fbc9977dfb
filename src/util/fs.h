/* Small filesystem helpers shared by the writers (mkmodel, tokenizer layout, dumps). */
#ifndef DI_UTIL_FS_H
#define DI_UTIL_FS_H

#include "deepinfer.h"

/* mkdir -p: creates dir and its missing parents (mode 0755); existing directories are fine. */
int di_mkdir_p(const char *dir, di_error *err);

#endif
