/* Runtime CPU feature dispatch for the CPU backend's kernels.
 *
 * The build compiles for the baseline ISA; kernels that use AVX2+FMA or AVX-512 carry per-function
 * target attributes and are chosen at run time. Every SIMD path must produce results bit-identical
 * to the scalar path (kernels define their reduction order independently of vector width), so the
 * choice only changes speed — tests force each level and compare. */
#ifndef DI_UTIL_CPU_FEATURES_H
#define DI_UTIL_CPU_FEATURES_H

typedef enum di_cpu_isa {
    DI_ISA_SCALAR = 0,
    DI_ISA_AVX2 = 1,   /* AVX2 + FMA */
    DI_ISA_AVX512 = 2  /* AVX-512 F + BW + DQ + VL (plus everything in AVX2) */
} di_cpu_isa;

/* Best level the hardware supports. */
di_cpu_isa di_cpu_isa_detect(void);
/* Level the kernels use now: the detected one, lowered by the environment variable
 * DI_CPU_ISA=scalar|avx2|avx512 (read once) or by di_cpu_isa_set. */
di_cpu_isa di_cpu_isa_active(void);
/* Force a level (clamped to what the hardware supports); returns the level now active.
 * Not thread-safe against running kernels: call between jobs (tests, startup). */
di_cpu_isa di_cpu_isa_set(di_cpu_isa isa);
const char *di_cpu_isa_name(di_cpu_isa isa);

#endif
