/* Shared helpers for the cmocka tests (linked into every test binary). */
#ifndef DI_TESTS_TESTUTIL_H
#define DI_TESTS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* Repository-relative path of committed test data: tests/data/<rel>. Tests run from the repo root. */
const char *tu_data(const char *rel);
/* ../shared/golden/<rel> (or $DI_SHARED_GOLDEN/<rel>) if that exists (larger cases not committed),
 * else NULL. */
const char *tu_shared_golden(const char *rel);
/* A fresh empty directory under $TMPDIR (removed by tu_rmtree). */
char *tu_tmpdir(const char *tag);
void tu_rmtree(const char *dir);
/* Write bytes to dir/name; returns the malloc'd path. */
char *tu_write_file(const char *dir, const char *name, const void *data, size_t n);
/* Copy a whole file. Returns 0 on success. */
int tu_copy_file(const char *src, const char *dst);
/* Write the tiny random-weight preset (mkmodel) into dir with this seed, shipping the tokenizer at
 * tokenizer (a file or directory; NULL = none). 0 on success; prints the error otherwise. */
int tu_write_tiny_model(const char *dir, uint64_t seed, const char *tokenizer);
/* Write v41-tiny-sel (tests/data) into dir with the real model's 128-position window and index top-64:
 * prompts shorter and longer than the window, several 64-index attention blocks. 0 on success. */
int tu_write_sel_w128(const char *dir);
/* Print a measured number in TAP-comment form so CI logs show it: "# name: value". */
void tu_report(const char *fmt, ...);

#endif
