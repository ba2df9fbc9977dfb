/* A golden case opened for the model tests (test_forward, test_verify): the checkpoint, its golden
 * outputs and a one-thread CPU backend, plus the full verify with every bound asserted. */
#ifndef DI_TESTS_GOLDEN_CASE_H
#define DI_TESTS_GOLDEN_CASE_H

#include "backend/backend.h"
#include "model/forward.h"
#include "model/golden.h"
#include "model/weights.h"

typedef struct fixture {
    di_model *m;
    di_golden *g;
    di_backend *be;
} fixture;

/* 0 on success; prints the error otherwise. dir NULL (a case that is absent) returns -1. */
int open_case(const char *dir, fixture *f);
void close_case(fixture *f);
/* di_verify_run on the case with the committed kernels vectors; asserts every op, block, top-k and
 * logits bound and prints every number (tu_report). */
void check_case(const char *dir);

#endif
