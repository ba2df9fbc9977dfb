#include "util/fs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "util/error.h"

int di_mkdir_p(const char *dir, di_error *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return di_error_set(err, DI_ERR_INVALID, "%.64s...: path too long", dir);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
                return di_error_set(err, DI_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
            *p = '/';
        }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return di_error_set(err, DI_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));
    return DI_OK;
}
