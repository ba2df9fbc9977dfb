/* Philox4x32-10: the counter-based RNG of Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as
 * easy as 1, 2, 3" (SC'11). A keyed bijection of a 128-bit counter, so any draw is a pure function
 * of (key, counter): no stream state to carry between steps, nothing that depends on which other
 * requests share a batch or on the order rows are processed. The sampler keys it by the request's
 * seed and counts by (position, choice index, purpose) — see sampler.h.
 *
 * Checked against the published known-answer vectors of the Random123 distribution (test_sampler). */
#ifndef DI_ENGINE_PHILOX_H
#define DI_ENGINE_PHILOX_H

#include <stdint.h>

/* Counter word 3: which use of a position's randomness. Separate streams, so adding a use (e.g.
 * speculative acceptance) never shifts the draws of another. */
typedef enum di_rng_purpose {
    DI_RNG_SAMPLE = 0,      /* the sampler's inverse-CDF draw */
    DI_RNG_SPEC_ACCEPT = 1, /* speculative decoding: acceptance uniform of the draft token at a position */
    DI_RNG_SPEC_RESIDUAL = 2 /* speculative decoding: the draw from the residual distribution */
} di_rng_purpose;

/* out[4] = Philox4x32-10(ctr[4], key[2]). out may alias ctr. */
void di_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A uniform double in [0, 1) with 53 random bits, from the first two output words of one block. */
double di_philox_uniform(uint64_t seed, uint64_t position, uint32_t choice, uint32_t purpose);

#endif
