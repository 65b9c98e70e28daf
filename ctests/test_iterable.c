/* Iterable sources: the caller's stream through stoker_iterable_callbacks. Each rank opens its
 * own stream per epoch (stoker_stream_info), batches do not depend on num_workers, num_samples
 * gives every rank the same batch count with uneven streams, a resumed loader continues exactly
 * (by replay, or from the stream's own state), failures carry the callback's message (or are
 * replaced under on_error=skip), and every opened stream is closed, user dropped once. */
#include <stdatomic.h>

#include "testutil.h"

typedef struct {
  int n;             /* rank r of w streams ids r, r + w, ... below n */
  int short_rank0;   /* rank 0's stream is this much shorter */
  int bad;           /* next() fails for this id (-1: never) */
  int open_fails;
  atomic_int opens, closes, drops;
  uint64_t epochs[8]; /* of the first 8 opens */
  uint64_t last_seed, last_world;
  char first_resume[64]; /* resume_state given to the first open() */
} source;

static void init(source *s, int n, int short_rank0, int bad, int open_fails) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->short_rank0 = short_rank0;
  s->bad = bad;
  s->open_fails = open_fails;
  atomic_init(&s->opens, 0);
  atomic_init(&s->closes, 0);
  atomic_init(&s->drops, 0);
}

typedef struct {
  int next_id, step, end;
  char state[32];
} stream;

static int32_t s_open(void *user, const stoker_stream_info *info, const char *resume,
                      void **out) {
  source *s = user;
  if (s->open_fails) {
    stoker_stream_fail("the stream is on holiday");
    return 1;
  }
  int k = atomic_fetch_add(&s->opens, 1), first = k == 0;
  if (k < 8) s->epochs[k] = info->epoch;
  s->last_seed = info->seed;
  s->last_world = info->world_size;
  CHECK(info->worker == 0 && info->num_workers == 1);
  stream *st = malloc(sizeof *st);
  st->step = (int)info->world_size;
  st->next_id = (int)info->rank;
  int count = (s->n - (int)info->rank + st->step - 1) / st->step;
  if (info->rank == 0) count -= s->short_rank0;
  st->end = st->next_id + count * st->step;
  if (first) snprintf(s->first_resume, sizeof s->first_resume, "%s", resume ? resume : "");
  if (resume) st->next_id = atoi(resume);
  *out = st;
  return 0;
}

static int32_t s_next(void *user, void *stream_, stoker_sample *out) {
  source *s = user;
  stream *st = stream_;
  if (st->next_id >= st->end) return STOKER_END_OF_EPOCH;
  int id = st->next_id;
  st->next_id += st->step;
  if (id == s->bad) {
    stoker_sample_fail(out, "id is unlucky");
    return 2;
  }
  int64_t x[2] = {id, -id};
  int64_t shape[1] = {2};
  if (stoker_sample_put_tensor(out, "x", STOKER_DTYPE_I64, 1, shape, x) != STOKER_OK) return 2;
  return stoker_sample_put_label(out, id) == STOKER_OK ? 0 : 2;
}

static void s_close(void *user, void *stream_) {
  atomic_fetch_add(&((source *)user)->closes, 1);
  free(stream_);
}

static void s_drop(void *user) { atomic_fetch_add(&((source *)user)->drops, 1); }

static const char *s_save(void *user, void *stream_) {
  (void)user;
  stream *st = stream_;
  snprintf(st->state, sizeof st->state, "%d", st->next_id);
  return st->state;
}

static stoker_loader *make(source *s, int with_state, const char *const *kv) {
  stoker_iterable_callbacks cb = {s, s_open, s_next, s_close, s_drop, with_state ? s_save : NULL};
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set_iterable_callbacks(o, &cb), STOKER_OK);
  for (; kv && kv[0]; kv += 2) CHECK_STATUS(stoker_options_set(o, kv[0], kv[1]), STOKER_OK);
  stoker_loader *l = NULL;
  stoker_status st = stoker_loader_new(o, &l);
  stoker_options_free(o);
  if (st != STOKER_OK) return NULL;
  return l;
}

/* Labels of the rest of the current epoch (checking x = [id, -id]); returns how many. */
static int epoch_ids(stoker_loader *l, int64_t *ids, int max, int *batches) {
  int n = 0;
  *batches = 0;
  stoker_batch *b;
  stoker_status st;
  while ((st = stoker_loader_next(l, &b)) == STOKER_OK) {
    stoker_tensor x, lab;
    CHECK_STATUS(stoker_batch_field_by_name(b, "x", &x), STOKER_OK);
    CHECK_STATUS(stoker_batch_field_by_name(b, "label", &lab), STOKER_OK);
    for (int64_t r = 0; r < lab.shape[0]; r++) {
      int64_t id = ((int64_t *)lab.data)[r];
      CHECK(((int64_t *)x.data)[2 * r] == id && ((int64_t *)x.data)[2 * r + 1] == -id);
      if (n < max) ids[n++] = id;
    }
    (*batches)++;
    stoker_batch_release(b);
  }
  CHECK_STATUS(st, STOKER_END_OF_EPOCH);
  return n;
}

int main(void) {
  int64_t a[128], b[128];
  int ba, bb;

  /* One rank: the stream in order, length unknown, fields from the first sample. */
  source s1;
  init(&s1, 23, 0, -1, 0);
  const char *kv1[] = {"batch_size", "4", "num_workers", "2", "seed", "9", NULL};
  stoker_loader *l = make(&s1, 0, kv1);
  CHECK(l != NULL);
  CHECK(stoker_loader_batches_per_epoch(l) == -1);
  CHECK(epoch_ids(l, a, 128, &ba) == 23 && ba == 6);
  for (int i = 0; i < 23; i++) CHECK(a[i] == i);
  CHECK(epoch_ids(l, a, 128, &ba) == 23);
  stoker_loader_free(l);
  /* Read once the loader (and its feeder thread) is gone. */
  CHECK(s1.last_seed == 9 && s1.epochs[0] == 0 && s1.epochs[1] == 1);
  CHECK(atomic_load(&s1.opens) >= 2 && atomic_load(&s1.opens) == atomic_load(&s1.closes));
  CHECK(atomic_load(&s1.drops) == 1);

  /* Same batches whatever num_workers, with a shuffle buffer. */
  source s2, s3;
  init(&s2, 40, 0, -1, 0);
  init(&s3, 40, 0, -1, 0);
  const char *kv2[] = {"batch_size", "5", "num_workers", "0", "shuffle_buffer", "8", NULL};
  const char *kv3[] = {"batch_size", "5", "num_workers", "3", "shuffle_buffer", "8", NULL};
  stoker_loader *l2 = make(&s2, 0, kv2), *l3 = make(&s3, 0, kv3);
  int na = epoch_ids(l2, a, 128, &ba), nb = epoch_ids(l3, b, 128, &bb);
  CHECK(na == 40 && nb == 40 && memcmp(a, b, sizeof(int64_t) * 40) == 0);
  int in_order = 1;
  for (int i = 0; i < 40; i++) in_order &= a[i] == i;
  CHECK(!in_order);
  stoker_loader_free(l2);
  stoker_loader_free(l3);

  /* Two ranks, uneven streams, num_samples: the same number of batches on both. */
  int batches[2];
  for (int rank = 0; rank < 2; rank++) {
    source s;
    init(&s, 31, 4, -1, 0);
    char r[8];
    snprintf(r, sizeof r, "%d", rank);
    const char *kv[] = {"batch_size", "4", "num_workers", "1", "num_samples", "31",
                        "world_size", "2", "rank", r, NULL};
    stoker_loader *lr = make(&s, 0, kv);
    CHECK(stoker_loader_batches_per_epoch(lr) == 4); /* ceil(ceil(31 / 2) / 4) */
    CHECK(epoch_ids(lr, a, 128, &batches[rank]) == 16);
    for (int i = 0; i < 16; i++) CHECK(a[i] % 2 == rank);
    stoker_loader_free(lr);
    CHECK(s.last_world == 2);
    CHECK(atomic_load(&s.opens) == atomic_load(&s.closes));
  }
  CHECK(batches[0] == 4 && batches[1] == 4);

  /* Resume mid-epoch, by replay and from the stream's state. */
  for (int with_state = 0; with_state < 2; with_state++) {
    source s;
    init(&s, 30, 0, -1, 0);
    const char *kv[] = {"batch_size", "3", "num_workers", "2", NULL};
    stoker_loader *lw = make(&s, with_state, kv);
    stoker_batch *batch;
    for (int i = 0; i < 4; i++) {
      CHECK_STATUS(stoker_loader_next(lw, &batch), STOKER_OK);
      stoker_batch_release(batch);
    }
    size_t needed = 0;
    CHECK_STATUS(stoker_loader_save_state(lw, NULL, 0, &needed), STOKER_OK);
    char *state = malloc(needed);
    CHECK_STATUS(stoker_loader_save_state(lw, state, needed, &needed), STOKER_OK);
    stoker_loader_free(lw);
    source s_again;
    init(&s_again, 30, 0, -1, 0);
    const char *kvr[] = {"batch_size", "3", "num_workers", "2", "resume_state", state, NULL};
    stoker_loader *lr = make(&s_again, with_state, kvr);
    CHECK(epoch_ids(lr, a, 128, &ba) == 18);
    for (int i = 0; i < 18; i++) CHECK(a[i] == 12 + i);
    CHECK(strcmp(s_again.first_resume, with_state ? "12" : "") == 0);
    stoker_loader_free(lr);
    free(state);
  }

  /* A failing sample: STOKER_ERR_CALLBACK with its message; skip replaces it. */
  source sf, ss, so;
  init(&sf, 12, 0, 5, 0);
  init(&ss, 12, 0, 5, 0);
  init(&so, 5, 0, -1, 1);
  const char *kvf[] = {"batch_size", "4", "num_workers", "1", NULL};
  stoker_loader *lf = make(&sf, 0, kvf);
  stoker_batch *batch;
  stoker_status st;
  int errors = 0;
  while ((st = stoker_loader_next(lf, &batch)) != STOKER_END_OF_EPOCH) {
    if (st == STOKER_OK) {
      stoker_batch_release(batch);
    } else {
      CHECK_STATUS(st, STOKER_ERR_CALLBACK);
      CHECK_ERROR_HAS("id is unlucky");
      errors++;
    }
  }
  CHECK(errors == 1);
  stoker_loader_free(lf);
  const char *kvs[] = {"batch_size", "4", "num_workers", "1", "on_error", "skip", NULL};
  stoker_loader *ls = make(&ss, 0, kvs);
  CHECK(epoch_ids(ls, a, 128, &ba) == 12);
  for (int i = 0; i < 12; i++) CHECK(a[i] != 5);
  stoker_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  CHECK_STATUS(stoker_loader_stats(ls, &stats), STOKER_OK);
  CHECK(stats.samples_skipped == 1);
  stoker_loader_free(ls);

  /* open() failing: the loader is not made, the message is the callback's. */
  CHECK(make(&so, 0, NULL) == NULL);
  CHECK_ERROR_HAS("the stream is on holiday");
  CHECK(atomic_load(&so.drops) == 1);

  /* Misuse. */
  CHECK_STATUS(stoker_stream_fail("outside"), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("outside an iterable");
  stoker_iterable_callbacks no_next = {&so, s_open, NULL, NULL, s_drop, NULL};
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set_iterable_callbacks(o, &no_next), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("required");
  CHECK(atomic_load(&so.drops) == 2);
  CHECK_STATUS(stoker_options_set_iterable_callbacks(NULL, &no_next), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_options_set_iterable_callbacks(o, NULL), STOKER_ERR_INVALID_ARGUMENT);
  stoker_options_free(o);
  return t_finish("test_iterable");
}
