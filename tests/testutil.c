#include "testutil.h"

#include "model/mkmodel.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *tu_data(const char *rel) {
    static char buf[8][1024];
    static int k;
    char *b = buf[k++ & 7];
    snprintf(b, 1024, "tests/data/%s", rel);
    return b;
}

const char *tu_shared_golden(const char *rel) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ & 3];
    /* DI_SHARED_GOLDEN overrides the location (e.g. when working from a git worktree) */
    const char *root = getenv("DI_SHARED_GOLDEN");
    snprintf(b, 1024, "%s/%s", root && root[0] ? root : "../shared/golden", rel);
    struct stat sb;
    return stat(b, &sb) == 0 ? b : NULL;
}

char *tu_tmpdir(const char *tag) {
    const char *t = getenv("TMPDIR");
    char tmpl[1024];
    snprintf(tmpl, sizeof tmpl, "%s/di-%s-XXXXXX", t ? t : "/tmp", tag);
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void tu_rmtree(const char *dir) {
    if (!dir || !dir[0] || strcmp(dir, "/") == 0) return;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", dir);
}

char *tu_write_file(const char *dir, const char *name, const void *data, size_t n) {
    size_t len = strlen(dir) + strlen(name) + 2;
    char *p = malloc(len);
    snprintf(p, len, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) return p;
    fwrite(data, 1, n, f);
    fclose(f);
    return p;
}

int tu_copy_file(const char *src, const char *dst) {
    FILE *a = fopen(src, "rb"), *b = fopen(dst, "wb");
    if (!a || !b) {
        if (a) fclose(a);
        if (b) fclose(b);
        return -1;
    }
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    return fclose(b);
}

void tu_report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    printf("# ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    fflush(stdout);
}

int tu_write_tiny_model(const char *dir, uint64_t seed, const char *tokenizer) {
    di_mkmodel_opts o = {.preset = "tiny", .seed = seed, .out_dir = dir, .tokenizer = tokenizer};
    di_mkmodel_stats st;
    di_error err = {0};
    if (di_mkmodel_write(&o, &st, &err)) {
        fprintf(stderr, "mkmodel: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int tu_write_sel_w128(const char *dir) {
    const char *files[] = {"model.safetensors", "model.safetensors.index.json", "engram_token_map.safetensors"};
    char src[4096], dst[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(src, sizeof src, "%s/%s", tu_data("v41-tiny-sel"), files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        if (tu_copy_file(src, dst)) return -1;
    }
    snprintf(src, sizeof src, "%s/config.json", tu_data("v41-tiny-sel"));
    snprintf(dst, sizeof dst, "%s/config.json", dir);
    json_error_t je;
    json_t *cfg = json_load_file(src, 0, &je), *tc = cfg ? json_object_get(cfg, "text_config") : NULL;
    int rc = -1;
    if (tc && !json_object_set_new(tc, "sliding_window", json_integer(128)) &&
        !json_object_set_new(tc, "index_topk", json_integer(64)))
        rc = json_dump_file(cfg, dst, JSON_INDENT(1));
    json_decref(cfg);
    return rc;
}
