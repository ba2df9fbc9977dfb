/* Mock model runner (see mock_runner.h). */
#include "engine/mock_runner.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t history_hash(uint64_t salt, const int32_t *tokens, int64_t n) {
    uint64_t h = mix64(salt);
    for (int64_t i = 0; i < n; i++) h = mix64(h ^ (uint32_t)tokens[i]);
    return h;
}

static void logits_from_hash(const di_mock_options *o, uint64_t h, float *logits) {
    for (int32_t v = 0; v < o->n_vocab; v++) {
        float u = (float)(mix64(h + (uint64_t)v * 0xD1B54A32D192ED03ull) >> 40) * (1.0f / 16777216.0f);
        logits[v] = o->sharpness * u * u * u - 2.0f;
    }
}

void di_mock_logits(const di_mock_options *opt, const int32_t *tokens, int64_t n, float *logits) {
    logits_from_hash(opt, history_hash(opt->salt, tokens, n), logits);
}

static int64_t life_of(const di_mock_runner *m, int64_t id) {
    return (int64_t)(intptr_t)di_idmap_get(&m->lives, id); /* 0 before the first release */
}

static int mock_forward(void *ctx, const di_step_batch *b, float *logits, di_error *err) {
    di_mock_runner *m = ctx;
    const int64_t bt = m->opt.block_tokens, n_slots = (int64_t)m->opt.n_blocks * bt;
    m->n_forward++;
    if (m->n_forward == m->opt.fail_forward)
        return di_error_set(err, DI_ERR_INTERNAL, "mock: injected failure in forward %lld (step %llu)",
                            (long long)m->n_forward, (unsigned long long)b->step);
    if (b->n_seqs > m->max_batch_seen) m->max_batch_seen = b->n_seqs;
    int64_t total = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_step_seq *s = &b->seqs[i];
        total += s->n_tokens;
        if (s->n_tokens < 1 || s->pos0 < 0 || s->pos0 + s->n_tokens > m->opt.max_context ||
            (int64_t)s->n_blocks * bt < s->pos0 + s->n_tokens)
            return di_error_set(err, DI_ERR_INTERNAL, "mock: request %lld positions [%lld, %lld) with %d blocks of %lld",
                                (long long)s->req_id, (long long)s->pos0, (long long)(s->pos0 + s->n_tokens), s->n_blocks,
                                (long long)bt);
        for (int32_t j = 0; j < i; j++)
            if (b->seqs[j].req_id == s->req_id)
                return di_error_set(err, DI_ERR_INTERNAL, "mock: request %lld twice in step %llu", (long long)s->req_id,
                                    (unsigned long long)b->step);
        if (m->n_log == m->cap_log) {
            int64_t cap = m->cap_log ? 2 * m->cap_log : 256;
            di_mock_piece *l = realloc(m->log, (size_t)cap * sizeof *l);
            if (!l) return di_error_set(err, DI_ERR_NOMEM, "mock: out of memory");
            m->log = l;
            m->cap_log = cap;
        }
        m->log[m->n_log++] = (di_mock_piece){b->step, s->req_id, s->pos0, s->n_tokens, b->n_seqs};
        m->n_fed_back += s->fed_back;
        for (int32_t j = 0; j < s->n_tokens; j++) {
            int64_t pos = s->pos0 + j, blk = s->blocks[pos / bt];
            if (blk < 0 || blk >= m->opt.n_blocks)
                return di_error_set(err, DI_ERR_INTERNAL, "mock: request %lld block id %lld out of range",
                                    (long long)s->req_id, (long long)blk);
            int64_t slot = blk * bt + pos % bt;
            m->slot_req[slot] = s->req_id;
            m->slot_pos[slot] = pos;
            m->slot_tok[slot] = s->tokens[j];
            m->slot_life[slot] = life_of(m, s->req_id);
        }
    }
    if (total != b->n_tokens) return di_error_set(err, DI_ERR_INTERNAL, "mock: batch says %lld tokens, pieces %lld",
                                                  (long long)b->n_tokens, (long long)total);
    /* logits: the history as the cache holds it */
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const di_step_seq *s = &b->seqs[i];
        if (s->logits_row < 0) continue;
        if (s->logits_row >= b->n_logits_rows)
            return di_error_set(err, DI_ERR_INTERNAL, "mock: logits row %d of %d", s->logits_row, b->n_logits_rows);
        uint64_t h = mix64(m->opt.salt);
        const int64_t life = life_of(m, s->req_id);
        for (int64_t pos = 0; pos < s->pos0 + s->n_tokens; pos++) {
            int64_t slot = (int64_t)s->blocks[pos / bt] * bt + pos % bt;
            if (slot < 0 || slot >= n_slots || m->slot_req[slot] != s->req_id || m->slot_pos[slot] != pos ||
                m->slot_life[slot] != life)
                return di_error_set(err, DI_ERR_INTERNAL,
                                    "mock: request %lld position %lld reads a slot holding request %lld position %lld",
                                    (long long)s->req_id, (long long)pos, (long long)m->slot_req[slot],
                                    (long long)m->slot_pos[slot]);
            h = mix64(h ^ (uint32_t)m->slot_tok[slot]);
        }
        logits_from_hash(&m->opt, h, logits + (size_t)s->logits_row * (size_t)m->opt.n_vocab);
    }
    if (m->opt.step_sleep_s > 0) {
        struct timespec ts = {(time_t)m->opt.step_sleep_s,
                              (long)((m->opt.step_sleep_s - (double)(time_t)m->opt.step_sleep_s) * 1e9)};
        nanosleep(&ts, NULL);
    }
    return DI_OK;
}

static void mock_release(void *ctx, int64_t req_id) {
    di_mock_runner *m = ctx;
    m->n_release++;
    /* a new life; on allocation failure the old one stays, which only weakens the check */
    di_idmap_put(&m->lives, req_id, (void *)(intptr_t)(life_of(m, req_id) + 1));
}

int di_mock_runner_new(const di_mock_options *opt, di_mock_runner **out, di_model_runner *iface, di_error *err) {
    *out = NULL;
    if (opt->n_vocab < 1 || opt->block_tokens < 1 || opt->n_blocks < 1 || opt->max_context < 2)
        return di_error_set(err, DI_ERR_INVALID, "mock runner: vocabulary %d, %d blocks of %d, context %lld",
                            opt->n_vocab, opt->n_blocks, opt->block_tokens, (long long)opt->max_context);
    di_mock_runner *m = calloc(1, sizeof *m);
    if (!m) return di_error_set(err, DI_ERR_NOMEM, "mock runner: out of memory");
    m->opt = *opt;
    if (m->opt.sharpness == 0.0f) m->opt.sharpness = 12.0f;
    size_t n = (size_t)opt->n_blocks * (size_t)opt->block_tokens;
    m->slot_req = malloc(n * sizeof *m->slot_req);
    m->slot_pos = malloc(n * sizeof *m->slot_pos);
    m->slot_tok = malloc(n * sizeof *m->slot_tok);
    m->slot_life = malloc(n * sizeof *m->slot_life);
    di_idmap_init(&m->lives);
    if (!m->slot_req || !m->slot_pos || !m->slot_tok || !m->slot_life) {
        di_mock_runner_free(m);
        return di_error_set(err, DI_ERR_NOMEM, "mock runner: out of memory for %zu slots", n);
    }
    for (size_t i = 0; i < n; i++) m->slot_req[i] = -1, m->slot_pos[i] = -1;
    memset(iface, 0, sizeof *iface);
    iface->ctx = m;
    iface->n_vocab = opt->n_vocab;
    iface->max_context = opt->max_context;
    iface->block_tokens = opt->block_tokens;
    iface->n_blocks = opt->n_blocks;
    iface->forward = mock_forward;
    iface->release = mock_release;
    *out = m;
    return DI_OK;
}

void di_mock_runner_free(di_mock_runner *m) {
    if (!m) return;
    free(m->slot_req);
    free(m->slot_pos);
    free(m->slot_tok);
    free(m->slot_life);
    di_idmap_destroy(&m->lives);
    free(m->log);
    free(m);
}
