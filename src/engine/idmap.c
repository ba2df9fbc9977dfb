/* Request id map (see idmap.h). */
#include "engine/idmap.h"

#include <stdlib.h>

static uint64_t slot_of(int64_t key, int64_t cap) {
    uint64_t x = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (x ^ (x >> 29)) & (uint64_t)(cap - 1);
}

void di_idmap_init(di_idmap *m) {
    m->keys = NULL;
    m->vals = NULL;
    m->cap = 0;
    m->n = 0;
}

void di_idmap_destroy(di_idmap *m) {
    free(m->keys);
    free(m->vals);
    di_idmap_init(m);
}

void *di_idmap_get(const di_idmap *m, int64_t key) {
    if (!m->cap) return NULL;
    for (uint64_t i = slot_of(key, m->cap);; i = (i + 1) & (uint64_t)(m->cap - 1)) {
        if (!m->vals[i]) return NULL;
        if (m->keys[i] == key) return m->vals[i];
    }
}

static int grow(di_idmap *m) {
    int64_t cap = m->cap ? 2 * m->cap : 64;
    int64_t *keys = malloc((size_t)cap * sizeof *keys);
    void **vals = calloc((size_t)cap, sizeof *vals);
    if (!keys || !vals) {
        free(keys);
        free(vals);
        return -1;
    }
    for (int64_t j = 0; j < m->cap; j++) {
        if (!m->vals[j]) continue;
        uint64_t i = slot_of(m->keys[j], cap);
        while (vals[i]) i = (i + 1) & (uint64_t)(cap - 1);
        keys[i] = m->keys[j];
        vals[i] = m->vals[j];
    }
    free(m->keys);
    free(m->vals);
    m->keys = keys;
    m->vals = vals;
    m->cap = cap;
    return 0;
}

int di_idmap_put(di_idmap *m, int64_t key, void *val) {
    if (2 * (m->n + 1) > m->cap && grow(m)) return -1; /* load factor <= 1/2 */
    uint64_t i = slot_of(key, m->cap);
    while (m->vals[i] && m->keys[i] != key) i = (i + 1) & (uint64_t)(m->cap - 1);
    if (!m->vals[i]) m->n++;
    m->keys[i] = key;
    m->vals[i] = val;
    return 0;
}

void di_idmap_del(di_idmap *m, int64_t key) {
    if (!m->cap) return;
    const uint64_t mask = (uint64_t)(m->cap - 1);
    uint64_t i = slot_of(key, m->cap);
    while (m->vals[i] && m->keys[i] != key) i = (i + 1) & mask;
    if (!m->vals[i]) return;
    /* backward shift: pull later members of the probe run into the hole, no tombstones */
    for (uint64_t j = (i + 1) & mask; m->vals[j]; j = (j + 1) & mask) {
        uint64_t home = slot_of(m->keys[j], m->cap);
        /* j's entry may move to i iff i lies cyclically in [home, j) */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->vals[i] = NULL;
    m->n--;
}
