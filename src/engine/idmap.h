/* Request id → pointer map (open addressing, linear probing, backward-shift deletion): O(1) lookups
 * for add / cancel / poll when an offline batch holds 10^5 requests. */
#ifndef DI_ENGINE_IDMAP_H
#define DI_ENGINE_IDMAP_H

#include <stdint.h>

typedef struct di_idmap {
    int64_t *keys;   /* [cap] */
    void **vals;     /* [cap] NULL = empty slot */
    int64_t cap;     /* power of two */
    int64_t n;
} di_idmap;

void di_idmap_init(di_idmap *m);
void di_idmap_destroy(di_idmap *m);
void *di_idmap_get(const di_idmap *m, int64_t key);
/* val != NULL; replaces an existing entry. 0, or -1 when out of memory. */
int di_idmap_put(di_idmap *m, int64_t key, void *val);
void di_idmap_del(di_idmap *m, int64_t key);

#endif
