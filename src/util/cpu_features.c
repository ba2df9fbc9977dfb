/* CPU ISA detection and the process-wide kernel level (see cpu_features.h). */
#include "util/cpu_features.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* di_cpu_isa once initialised, −1 before. Kernels on several threads may be the first to ask: the
 * atomic makes that race defined (every racer computes and stores the same value). */
static atomic_int g_active = -1;

di_cpu_isa di_cpu_isa_detect(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    if (avx512) return DI_ISA_AVX512;
    if (avx2) return DI_ISA_AVX2;
#endif
    return DI_ISA_SCALAR;
}

static di_cpu_isa clamp_isa(di_cpu_isa want) {
    di_cpu_isa hw = di_cpu_isa_detect();
    return want > hw ? hw : want;
}

di_cpu_isa di_cpu_isa_active(void) {
    int active = atomic_load_explicit(&g_active, memory_order_relaxed);
    if (active < 0) {
        /* AVX-512 is opt-in (DI_CPU_ISA=avx512) until its bit-identity with the scalar path has been
         * checked on AVX-512 hardware (test_cpu_ops/test_invariance does that wherever it runs). */
        di_cpu_isa want = DI_ISA_AVX2;
        const char *env = getenv("DI_CPU_ISA");
        if (env && !strcmp(env, "avx512")) want = DI_ISA_AVX512;
        else if (env && !strcmp(env, "scalar")) want = DI_ISA_SCALAR;
        else if (env && !strcmp(env, "avx2")) want = DI_ISA_AVX2;
        active = (int)clamp_isa(want);
        atomic_store_explicit(&g_active, active, memory_order_relaxed);
    }
    return (di_cpu_isa)active;
}

di_cpu_isa di_cpu_isa_set(di_cpu_isa isa) {
    int active = (int)clamp_isa(isa);
    atomic_store_explicit(&g_active, active, memory_order_relaxed);
    return (di_cpu_isa)active;
}

const char *di_cpu_isa_name(di_cpu_isa isa) {
    switch (isa) {
    case DI_ISA_SCALAR: return "scalar";
    case DI_ISA_AVX2: return "avx2";
    case DI_ISA_AVX512: return "avx512";
    }
    return "?";
}
