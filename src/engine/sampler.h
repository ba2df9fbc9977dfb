/* Token sampler: one logits row in, one token (+ logprobs) out.
 *
 * Processing order (fixed; every stage sees the output of the one before):
 *   1. penalties     repetition (prompt + output tokens), then frequency and presence (output tokens)
 *   2. logit bias    logit[t] += bias[t]
 *   3. grammar mask  logit[t] = -inf where the caller's bitmask has bit t clear
 *   4. temperature   T == 0: greedy — argmax, lowest id on ties, stages 5–7 skipped; else logit /= T
 *   5. top-k         keep the k best
 *   6. top-p         keep the shortest best-first prefix whose probability mass reaches p
 *   7. min-p         keep tokens with p(t) >= min_p · p(best)
 * then one draw by inverse CDF from the survivors.
 *
 * Order of candidates ("best first"): logit descending, token id ascending on equal logits. Every
 * truncation and every cumulative sum walks this order, so the result is a function of the row
 * alone — never of the batch it came in, of the thread that ran it, or of the memory layout.
 *
 * Numerics (the test's reference implementation restates them, so they are part of the contract):
 *   weights     e(t) = di_sampler_exp(logit(t) − logit(best))   f32, after temperature
 *   mass sums   Σ e(t) in double; over a truncated candidate list in best-first order, over the whole
 *               vocabulary (no top-k / top-p cut) in id order
 *   top-p       keep the first m candidates, m minimal with Σ_{i<m} e(i) >= top_p · Z, Z the mass of
 *               the set that top-p received
 *   min-p       keep t iff e(t) >= min_p (the ratio p(t)/p(best) does not depend on normalisation)
 *   draw        u ∈ [0,1) from Philox4x32-10 (philox.h), key = seed, counter = (position, choice,
 *               purpose 0); the token is the first whose running mass exceeds u · Z, walking the same
 *               order as the sums (the last candidate if rounding leaves u · Z uncovered).
 *
 * Determinism: the draw depends on (seed, position, choice) only, where position is the absolute
 * position of the token being sampled in its sequence (prompt length + output index) and choice is
 * the index among the request's parallel samples (OpenAI n). So a seeded request yields the same
 * tokens run after run, in any batch, and after preemption and recompute.
 *
 * Logprobs follow OpenAI / vLLM (logprobs_mode = raw_logprobs): by default the log-softmax of the
 * RAW model logits, before penalties, bias, mask, temperature and truncation — what the model
 * believed, not what the sampler was allowed to pick. DI_LOGPROBS_PROCESSED gives the distribution
 * actually sampled from (after every stage; −inf outside the survivors; for greedy, the log-softmax
 * after stages 1–3). Top-logprobs list the n best of that distribution, best first.
 *
 * Fast path for the 129,280-token vocabulary: stages 1–3 touch only the listed tokens / mask words
 * that need it, top-k is an exact radix selection (four 8-bit passes over order-preserving keys) plus
 * a sort of the k winners, and top-p without top-k selects a growing best-first prefix (64, 512, …)
 * until the mass is covered, so no full-vocabulary sort happens unless the row needs one. */
#ifndef DI_ENGINE_SAMPLER_H
#define DI_ENGINE_SAMPLER_H

#include <stdint.h>

#include "util/error.h"

/* di_sampling_params, di_token_bias and di_logprobs_mode are public (include/deepinfer.h). */
#define DI_SAMPLER_MAX_TOP_LOGPROBS DI_MAX_TOP_LOGPROBS

/* Range checks with a message naming the field and the accepted range. n_vocab bounds bias ids. */
int di_sampling_params_check(const di_sampling_params *p, int32_t n_vocab, di_error *err);

/* One row to sample. */
typedef struct di_sample_row {
    const float *logits;        /* [n_vocab] f32 raw model logits; read only */
    const di_sampling_params *params;
    const int32_t *prompt;      /* [n_prompt] ids, for the repetition penalty (may be NULL if 0) */
    int64_t n_prompt;
    const int32_t *output;      /* [n_output] ids generated so far, for all penalties */
    int64_t n_output;
    const uint32_t *mask;       /* [ceil(n_vocab/32)] allowed-token bitmask (bit t%32 of word t/32), NULL = all */
    int64_t position;           /* absolute position of the token being sampled */
    uint32_t choice;            /* index among parallel samples of one request */
} di_sample_row;

typedef struct di_sample_result {
    int32_t token;
    float logprob;                                   /* of token, in the params' logprobs_mode (0 if not asked) */
    int32_t n_top;                                   /* entries filled in top_* (<= n_top_logprobs) */
    int32_t top_ids[DI_SAMPLER_MAX_TOP_LOGPROBS];    /* best first */
    float top_logprobs[DI_SAMPLER_MAX_TOP_LOGPROBS];
} di_sample_result;

/* The sampler's exponential, e^x for x <= 0 (0 below −87): Cody–Waite reduction by ln 2, a degree-7
 * polynomial, and an exponent-bit scale — only IEEE adds and multiplies, no libm. Written out so the
 * weights (hence the sampled token) are the same bits on every platform, and a CUDA sampler can
 * reproduce them exactly with the same operation sequence (fmaf contraction off); libm expf
 * differs between C libraries and from CUDA's. Max error ≈ 2 ulp (test_sampler checks). Branch-free,
 * so loops over the vocabulary vectorize. */
static inline float di_sampler_exp(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693145751953125f, ln2_lo = 1.42860682030941723212e-6f;
    const float round_magic = 12582912.0f; /* 1.5 · 2^23: adding it rounds to an integer */
    float xc = x < -87.0f ? -87.0f : (x > 0.0f ? 0.0f : x);
    float n = (xc * log2e + round_magic) - round_magic;
    float r = (xc - n * ln2_hi) - n * ln2_lo;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    union { uint32_t u; float f; } scale;
    scale.u = (uint32_t)((int32_t)n + 127) << 23;
    float y = p * scale.f;
    return x < -87.0f ? 0.0f : y;
}

/* Scratch for one row at a time (one per thread); O(n_vocab) memory, allocated once. */
typedef struct di_sampler di_sampler;

int di_sampler_new(int32_t n_vocab, di_sampler **out, di_error *err);
void di_sampler_free(di_sampler *s);

/* Errors: bad params, an id outside [0, n_vocab) in prompt/output, a NaN logit, or no token left
 * after the mask (DI_ERR_INVALID, message names the cause). */
int di_sampler_sample(di_sampler *s, const di_sample_row *row, di_sample_result *out, di_error *err);

/* Exposed for tests and for the grammar-free top-logprobs path: the m best entries of x (finite or
 * +inf values only; -inf never selected) in best-first order. Returns the count (<= m).
 * ids: [m] int32 output. */
int64_t di_sampler_select_top(di_sampler *s, const float *x, int64_t m, int32_t *ids);

#endif
