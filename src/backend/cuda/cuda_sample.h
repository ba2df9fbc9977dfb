/* Batched token sampling on the GPU, bit-identical to the CPU sampler (src/engine/sampler.h).
 *
 * Input: device logits rows [n_rows, n_vocab] f32 and, per row, the same di_sample_row the CPU
 * sampler takes (params, prompt/output ids for the penalties, grammar bitmask, position, choice; its
 * `logits` field is ignored). Output: per row the same di_sample_result di_sampler_sample gives —
 * same token, same logprob bits, same top-logprob ids and bits — for every mode: greedy, temperature,
 * top-k, top-p, min-p, penalties, bias, mask, raw and processed logprobs.
 *
 * How (cuda_sample.cu): one thread block per row runs the contract's stages in its fixed order; the
 * parallel parts (stages 1–4, argmax, the exact radix selection, the weights e(t)) are spread over the
 * block, and the parts whose result depends on an order (the f64 mass sums and the inverse-CDF walks)
 * run in exactly the CPU's order. Rows never share data, so a row's result does not depend on the
 * other rows of the batch. The last step — log(Z) and the ≤ 21 f64 subtractions of the logprobs —
 * runs on the host with the C library's log, as the CPU sampler's does: libdevice's log is not
 * glibc's in the last bit.
 *
 * Layering: sampling is listed among the backend's ops (issue 9) but its row/result types belong to
 * the engine's sampler; this file reuses them instead of restating them. */
#ifndef DI_BACKEND_CUDA_CUDA_SAMPLE_H
#define DI_BACKEND_CUDA_CUDA_SAMPLE_H

#include <stdint.h>

#include "engine/sampler.h"
#include "util/error.h"

typedef struct di_cuda_sampler di_cuda_sampler;

/* Device scratch for `n_slots` rows in flight (≈ 2.7 MB each at n_vocab 129,280); a batch with more
 * rows reuses the slots in turn. n_slots 0 picks two per SM. */
int di_cuda_sampler_new(int32_t n_vocab, int32_t n_slots, di_cuda_sampler **out, di_error *err);
void di_cuda_sampler_free(di_cuda_sampler *s);

/* Samples n_rows rows. d_logits: [n_rows, n_vocab] f32 in device memory. rows: [n_rows] host
 * descriptors (row.logits unused). out: [n_rows] host results. stream: a cudaStream_t (NULL = the
 * legacy default stream); the call returns when the results are on the host.
 * row_err: [n_rows] per-row errors, or NULL. A bad row — bad params, an id out of range, a NaN/+inf
 * logit, no token left after the mask (di_sampler_sample's errors) — gets its code and message in
 * row_err[r] (out[r] zeroed) while every other row is still sampled, so one request never fails its
 * batch; rows that succeed get code 0, and the call itself fails only on a device error. Without
 * row_err a bad row fails the call (the message names it; rows rejected on the host — params, ids —
 * are reported before a device-side error; `out` is then unspecified). */
int di_cuda_sampler_sample(di_cuda_sampler *s, const float *d_logits, int32_t n_rows, const di_sample_row *rows,
                           di_sample_result *out, di_error *row_err, void *stream, di_error *err);

/* The f64 mass row r's logprobs were normalised by in the last call (0 if it asked for none), for
 * tests that check the ordered sum bit for bit: a summation-order error moves Z by ~1e-16 relative
 * and flips a returned f32 logprob only rarely. */
double di_cuda_sampler_last_mass(const di_cuda_sampler *s, int32_t r);

#endif
