/* Token vocabulary as a byte trie (see di_trie_node in grammar_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"

void di_grammar_vocab_free(di_grammar_vocab *v) {
    if (!v) return;
    if (v->bytes)
        for (uint32_t i = 0; i < v->n_vocab; i++) free(v->bytes[i]);
    free(v->bytes);
    free(v->lens);
    free(v->special);
    free(v->eos);
    free(v->nodes);
    free(v->dup_next);
    free(v);
}

uint32_t di_grammar_vocab_size(const di_grammar_vocab *v) { return v->n_vocab; }

static _Thread_local const di_grammar_vocab *g_sort_vocab; /* read only by cmp_tok */

static int cmp_tok(const void *a, const void *b) {
    /* qsort has no context argument in C11: a thread-local pointer keeps concurrent vocab
     * constructions on different threads independent. */
    const di_grammar_vocab *v = g_sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->lens[x], ly = v->lens[y], l = lx < ly ? lx : ly;
    int c = memcmp(v->bytes[x], v->bytes[y], l);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

int di_grammar_vocab_new(uint32_t n_vocab, const uint8_t *const *bytes, const uint32_t *lens, const uint8_t *special,
                         const int32_t *eos, size_t n_eos, di_grammar_vocab **out, di_error *err) {
    *out = NULL;
    if (n_vocab == 0) return di_error_set(err, DI_ERR_INVALID, "grammar vocab: empty vocabulary");
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] < 0 || (uint32_t)eos[i] >= n_vocab)
            return di_error_set(err, DI_ERR_INVALID, "grammar vocab: EOS id %d outside [0, %u)", eos[i], n_vocab);
    di_grammar_vocab *v = calloc(1, sizeof *v);
    if (!v) return di_error_set(err, DI_ERR_NOMEM, "grammar vocab: out of memory");
    v->n_vocab = n_vocab;
    v->bytes = calloc(n_vocab, sizeof *v->bytes);
    v->lens = calloc(n_vocab, sizeof *v->lens);
    v->special = calloc(n_vocab, 1);
    v->dup_next = malloc(n_vocab * sizeof *v->dup_next);
    v->eos = malloc((n_eos ? n_eos : 1) * sizeof *v->eos);
    int32_t *order = malloc(n_vocab * sizeof *order);
    if (!v->bytes || !v->lens || !v->special || !v->dup_next || !v->eos || !order) goto oom;
    memcpy(v->eos, eos, n_eos * sizeof *eos);
    v->n_eos = n_eos;
    for (size_t i = 0; i < n_eos; i++) v->special[eos[i]] = 1;
    uint32_t n_text = 0;
    size_t total = 0;
    for (uint32_t t = 0; t < n_vocab; t++) {
        v->dup_next[t] = -1;
        if (special && special[t]) v->special[t] = 1;
        if (lens[t] > UINT16_MAX) {
            free(order);
            di_grammar_vocab_free(v);
            return di_error_set(err, DI_ERR_INVALID, "grammar vocab: token %u is %u bytes (limit %u)", t, lens[t],
                                UINT16_MAX);
        }
        v->lens[t] = lens[t];
        if (lens[t]) {
            v->bytes[t] = malloc(lens[t]);
            if (!v->bytes[t]) goto oom;
            memcpy(v->bytes[t], bytes[t], lens[t]);
        }
        if (lens[t] > v->max_len) v->max_len = lens[t];
        if (!v->special[t] && lens[t]) order[n_text++] = (int32_t)t, total += lens[t];
    }
    g_sort_vocab = v;
    qsort(order, n_text, sizeof *order, cmp_tok);
    g_sort_vocab = NULL;
    /* Preorder construction: walking tokens in byte order, the current path is the previous
     * token's bytes; a new token shares its longest common prefix and adds one node per byte.
     * Nodes leave the path (their subtree is complete) when a later token diverges above them. */
    v->nodes = malloc((total + 1) * sizeof *v->nodes);
    uint32_t *path = malloc((v->max_len + 1) * sizeof *path);
    if (!v->nodes || !path) {
        free(path);
        goto oom;
    }
    uint32_t nn = 1, depth = 0;
    v->nodes[0] = (di_trie_node){.end = 0, .tok = -1, .depth = 0, .byte = 0};
    path[0] = 0;
    int32_t prev = -1;
    for (uint32_t i = 0; i < n_text; i++) {
        int32_t t = order[i];
        uint32_t l = 0;
        if (prev >= 0) {
            uint32_t lim = v->lens[t] < v->lens[prev] ? v->lens[t] : v->lens[prev];
            while (l < lim && v->bytes[t][l] == v->bytes[prev][l]) l++;
        }
        while (depth > l) v->nodes[path[depth--]].end = nn;
        for (uint32_t k = l; k < v->lens[t]; k++) {
            v->nodes[nn] = (di_trie_node){.end = 0, .tok = -1, .depth = (uint16_t)(k + 1), .byte = v->bytes[t][k], .dup = 0};
            path[++depth] = nn++;
        }
        di_trie_node *leaf = &v->nodes[path[depth]];
        if (leaf->tok < 0) {
            leaf->tok = t;
        } else { /* identical bytes: chain after the first */
            int32_t x = leaf->tok;
            while (v->dup_next[x] >= 0) x = v->dup_next[x];
            v->dup_next[x] = t;
            leaf->dup = 1;
        }
        prev = t;
    }
    while (depth > 0) v->nodes[path[depth--]].end = nn;
    v->nodes[0].end = nn;
    v->n_nodes = nn;
    /* FNV-1a over lengths, bytes and flags of every token, then the EOS ids */
    uint64_t fp = 0xCBF29CE484222325ull;
    for (uint32_t t = 0; t < n_vocab; t++) {
        fp = (fp ^ (v->lens[t] << 1 | v->special[t])) * 0x100000001B3ull;
        for (uint32_t k = 0; k < v->lens[t]; k++) fp = (fp ^ v->bytes[t][k]) * 0x100000001B3ull;
    }
    for (size_t i = 0; i < n_eos; i++) fp = (fp ^ (uint32_t)eos[i]) * 0x100000001B3ull;
    v->fingerprint = fp;
    free(path);
    free(order);
    *out = v;
    return DI_OK;
oom:
    free(order);
    di_grammar_vocab_free(v);
    return di_error_set(err, DI_ERR_NOMEM, "grammar vocab: out of memory for %u tokens", n_vocab);
}
