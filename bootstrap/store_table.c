/* The tcp store's keys (a uthash table), values and gather results as
 * refcounted blobs, and the max_bytes accounting of everything it holds. */
#include <stdlib.h>
#include <string.h>

#include "bootstrap/store-internal.h"

/* ---- accounting (max_bytes) ------------------------------------------------ */

int ncfsm__st_charge(ncfsm__store *s, uint64_t n) {
  if (s->bytes + n > s->o.max_bytes) return -1;
  s->bytes += n;
  if (s->bytes > s->st.peak_bytes) s->st.peak_bytes = s->bytes;
  return 0;
}
void ncfsm__st_uncharge(ncfsm__store *s, uint64_t n) { s->bytes -= n; }

struct blob *ncfsm__st_blob_new(ncfsm__store *s, size_t len) {
  if (ncfsm__st_charge(s, sizeof(struct blob) + len) != 0) return NULL;
  struct blob *b = malloc(sizeof *b + (len ? len : 1));
  if (!b) {
    ncfsm__st_uncharge(s, sizeof(struct blob) + len);
    return NULL;
  }
  b->s = s;
  b->refs = 1;
  b->len = len;
  LIST_INSERT_HEAD(&s->blobs, b, link);
  return b;
}

void ncfsm__st_blob_unref(struct blob *b) {
  if (--b->refs) return;
  if (b->s) {
    LIST_REMOVE(b, link);
    ncfsm__st_uncharge(b->s, sizeof *b + b->len);
  }
  free(b);
}

void ncfsm__st_blob_unref_cb(const void *data, size_t len, void *arg) {
  (void)data;
  (void)len;
  ncfsm__st_blob_unref(arg);
}

/* ---- the table -------------------------------------------------------------- */

struct entry *ncfsm__st_table_get(ncfsm__store *s, const uint8_t *key, uint32_t klen, int create) {
  struct entry *e = NULL;
  HASH_FIND(hh, s->tab, key, klen, e);
  if (e || !create) return e;
  if (ncfsm__st_charge(s, klen + sizeof *e) != 0) return NULL;
  e = calloc(1, sizeof *e);
  if (!e || !(e->key = malloc(klen ? klen : 1))) {
    free(e);
    ncfsm__st_uncharge(s, klen + sizeof *e);
    return NULL;
  }
  memcpy(e->key, key, klen);
  e->klen = klen;
  LIST_INIT(&e->waiters);
  HASH_ADD_KEYPTR(hh, s->tab, e->key, klen, e);
  if (!e->hh.tbl) { /* uthash could not allocate its table (HASH_NONFATAL_OOM) */
    free(e->key);
    free(e);
    ncfsm__st_uncharge(s, klen + sizeof *e);
    return NULL;
  }
  return e;
}

/* Free a gather's buffers (the result may live on in queued replies). */
void ncfsm__st_gather_release(ncfsm__store *s, struct entry *e) {
  if (e->g_buf) ncfsm__st_blob_unref(e->g_buf);
  e->g_buf = NULL;
  if (e->g_have) ncfsm__st_uncharge(s, e->g_size);
  free(e->g_have);
  e->g_have = NULL;
  if (e->gather && !e->failed) LIST_REMOVE(e, g_link);
}

char ncfsm__st_failed_oom[] = "allgather failed (and the store is out of memory)";

void ncfsm__st_entry_delete(ncfsm__store *s, struct entry *e) {
  HASH_DEL(s->tab, e);
  ncfsm__st_uncharge(s, e->klen + sizeof *e);
  if (e->val) ncfsm__st_blob_unref(e->val);
  if (e->gather) ncfsm__st_gather_release(s, e);
  if (e->failed && e->failed != ncfsm__st_failed_oom) {
    ncfsm__st_uncharge(s, strlen(e->failed) + 1);
    free(e->failed);
  }
  free(e->key);
  free(e);
}

/* An entry made only to park GET/WAITs is dropped once nobody waits on it. */
void ncfsm__st_entry_maybe_drop(ncfsm__store *s, struct entry *e) {
  if (!e->val && !e->gather && LIST_EMPTY(&e->waiters)) ncfsm__st_entry_delete(s, e);
}

/* "ag/3" for messages (keys are bytes). */
const char *ncfsm__st_key_str(const struct entry *e, char *buf, size_t n) {
  size_t k = 0;
  for (uint32_t i = 0; i < e->klen && k + 1 < n; i++)
    buf[k++] = (e->key[i] >= 0x20 && e->key[i] < 0x7f) ? (char)e->key[i] : '?';
  buf[k] = 0;
  return buf;
}

/* The rejoined rank restarts at allgather #0: drop the failed gathers nobody waits on. */
void ncfsm__st_table_drop_failed(ncfsm__store *s) {
  struct entry *e, *next;
  HASH_ITER(hh, s->tab, e, next)
    if (e->failed && LIST_EMPTY(&e->waiters)) ncfsm__st_entry_delete(s, e);
}

void ncfsm__st_table_clear(ncfsm__store *s) {
  struct entry *e, *next;
  HASH_ITER(hh, s->tab, e, next) ncfsm__st_entry_delete(s, e);
}
