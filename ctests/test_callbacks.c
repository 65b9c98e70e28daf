/* Custom sources: the caller's dataset through stoker_source_callbacks. Values round-trip,
 * batches do not depend on num_workers, failures carry the callback's message (or are skipped),
 * ragged fields are padded, drop runs exactly once, and misuse of a sample handle is an error. */
#include <stdatomic.h>

#include "testutil.h"

typedef struct {
  uint64_t n;
  atomic_int drops;
  int fail_index;            /* read() fails for this index (-1: never) */
  stoker_sample *kept;       /* a sample pointer kept past its call, to misuse later */
} dataset;

static uint64_t ds_len(void *user) { return ((dataset *)user)->n; }

static void ds_drop(void *user) { atomic_fetch_add(&((dataset *)user)->drops, 1); }

/* Sample i: x = float32 [i, 2i, 3i], tokens = int32 [0, 1, ..., i % 4 - 1], label = 7i. */
static int32_t ds_read(void *user, uint64_t index, stoker_sample *s) {
  dataset *d = user;
  if ((int)index == d->fail_index) {
    stoker_sample_fail(s, "sample five is cursed");
    return 1;
  }
  d->kept = s;
  float x[3] = {(float)index, 2.0f * (float)index, 3.0f * (float)index};
  int64_t shape[1] = {3};
  if (stoker_sample_put_tensor(s, "x", STOKER_DTYPE_F32, 1, shape, x) != STOKER_OK) return 1;
  int32_t tokens[3] = {0, 1, 2};
  int64_t tshape[1] = {(int64_t)(index % 4)};
  if (stoker_sample_put_tensor(s, "tokens", STOKER_DTYPE_I32, 1, tshape, tokens) != STOKER_OK)
    return 1;
  return stoker_sample_put_label(s, (int64_t)index * 7) == STOKER_OK ? 0 : 1;
}

/* A read that calls into its own loader (num_workers=0: on the thread inside next): the inner
 * call is refused instead of recursing without end, and the read fails its sample with it. */
static stoker_loader *g_self;
static stoker_status g_inner = STOKER_OK;
static int32_t reentrant_read(void *user, uint64_t index, stoker_sample *s) {
  if (g_self == NULL) return ds_read(user, index, s); /* the loader reads a sample to start */
  stoker_batch *b = NULL;
  g_inner = stoker_loader_next(g_self, &b);
  stoker_sample_fail(s, t_last_error());
  return 1;
}

static stoker_loader *make(dataset *d, const char *workers, const char *on_error) {
  stoker_source_callbacks cb = {d, ds_len, ds_read, ds_drop};
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set_source_callbacks(o, &cb), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "batch_size", "4"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "shuffle", "true"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "seed", "11"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "pad", "-1"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "num_workers", workers), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "on_error", on_error), STOKER_OK);
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);
  return l;
}

/* One epoch's labels in delivery order, checking every row against its label. */
static int epoch_labels(stoker_loader *l, int64_t *labels, int max) {
  int n = 0;
  stoker_batch *b;
  stoker_status st;
  while ((st = stoker_loader_next(l, &b)) == STOKER_OK) {
    stoker_tensor x, tok, len, lab;
    CHECK_STATUS(stoker_batch_field_by_name(b, "x", &x), STOKER_OK);
    CHECK_STATUS(stoker_batch_field_by_name(b, "tokens", &tok), STOKER_OK);
    CHECK_STATUS(stoker_batch_field_by_name(b, "tokens_lengths", &len), STOKER_OK);
    CHECK_STATUS(stoker_batch_field_by_name(b, "label", &lab), STOKER_OK);
    CHECK(x.dtype == STOKER_DTYPE_F32 && x.ndim == 2 && x.shape[1] == 3);
    CHECK(tok.dtype == STOKER_DTYPE_I32 && tok.ndim == 2);
    for (int64_t r = 0; r < x.shape[0]; r++) {
      int64_t i = ((int64_t *)lab.data)[r] / 7;
      const float *row = (const float *)x.data + r * 3;
      CHECK(row[0] == (float)i && row[1] == 2.0f * (float)i && row[2] == 3.0f * (float)i);
      int64_t length = ((int64_t *)len.data)[r];
      CHECK(length == i % 4);
      const int32_t *t = (const int32_t *)tok.data + r * tok.shape[1];
      for (int64_t k = 0; k < tok.shape[1]; k++) CHECK(t[k] == (k < length ? (int32_t)k : -1));
      if (n < max) labels[n++] = i;
    }
    stoker_batch_release(b);
  }
  CHECK_STATUS(st, STOKER_END_OF_EPOCH);
  return n;
}

int main(void) {
  /* Round trip and determinism across worker counts. */
  dataset d0 = {10, 0, -1, NULL}, d2 = {10, 0, -1, NULL};
  stoker_loader *l0 = make(&d0, "0", "raise"), *l2 = make(&d2, "2", "raise");
  int64_t a[16], b[16];
  int na = epoch_labels(l0, a, 16), nb = epoch_labels(l2, b, 16);
  CHECK(na == 10 && nb == 10);
  CHECK(memcmp(a, b, sizeof(int64_t) * 10) == 0);
  int seen[10] = {0};
  for (int i = 0; i < na; i++) seen[a[i]]++;
  for (int i = 0; i < 10; i++) CHECK(seen[i] == 1);

  /* drop runs once, when the last user (here the loader; the options are already freed) goes. */
  CHECK(atomic_load(&d0.drops) == 0);
  stoker_loader_free(l0);
  stoker_loader_free(l2);
  CHECK(atomic_load(&d0.drops) == 1 && atomic_load(&d2.drops) == 1);

  /* A sample handle used after its read() returned is inactive: an error, not corruption. */
  CHECK(d0.kept != NULL);
  CHECK_STATUS(stoker_sample_put_label(d0.kept, 1), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("not live");
  CHECK_STATUS(stoker_sample_fail(d0.kept, "late"), STOKER_ERR_INVALID_ARGUMENT);

  /* NULLs and bad values. */
  stoker_options *o = stoker_options_new();
  stoker_source_callbacks no_read = {&d0, ds_len, NULL, NULL};
  CHECK_STATUS(stoker_options_set_source_callbacks(NULL, &no_read), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_options_set_source_callbacks(o, NULL), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_options_set_source_callbacks(o, &no_read), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("required");
  stoker_options_free(o);
  CHECK_STATUS(stoker_sample_put_label(NULL, 1), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_sample_put_encoded(NULL, "x", 1), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_sample_put_tensor(d0.kept, "x", 42, 0, NULL, NULL),
               STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("not a stoker_dtype");

  /* A failing read: STOKER_ERR_CALLBACK with the callback's message; skip replaces it. */
  dataset df = {10, 0, 5, NULL};
  stoker_loader *lf = make(&df, "1", "raise");
  stoker_batch *batch;
  stoker_status st;
  int errors = 0;
  while ((st = stoker_loader_next(lf, &batch)) != STOKER_END_OF_EPOCH) {
    if (st == STOKER_OK) {
      stoker_batch_release(batch);
    } else {
      CHECK_STATUS(st, STOKER_ERR_CALLBACK);
      CHECK_ERROR_HAS("sample five is cursed");
      CHECK(batch == NULL);
      errors++;
    }
  }
  CHECK(errors == 1);
  stoker_loader_free(lf);

  dataset ds = {10, 0, 5, NULL};
  stoker_loader *ls = make(&ds, "2", "skip");
  int64_t c[16];
  CHECK(epoch_labels(ls, c, 16) == 10);
  for (int i = 0; i < 10; i++) CHECK(c[i] != 5);
  stoker_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  CHECK_STATUS(stoker_loader_stats(ls, &stats), STOKER_OK);
  CHECK(stats.samples_skipped == 1);
  stoker_loader_free(ls);
  CHECK(atomic_load(&df.drops) == 1 && atomic_load(&ds.drops) == 1);

  dataset dr = {4, 0, -1, NULL};
  stoker_source_callbacks rcb = {&dr, ds_len, reentrant_read, ds_drop};
  stoker_options *ro = stoker_options_new();
  CHECK_STATUS(stoker_options_set_source_callbacks(ro, &rcb), STOKER_OK);
  CHECK_STATUS(stoker_options_set(ro, "num_workers", "0"), STOKER_OK);
  CHECK_STATUS(stoker_loader_new(ro, &g_self), STOKER_OK);
  stoker_options_free(ro);
  stoker_batch *rb = NULL;
  CHECK_STATUS(stoker_loader_next(g_self, &rb), STOKER_ERR_CALLBACK);
  CHECK(g_inner == STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("in use by another call");
  stoker_loader_free(g_self);
  return t_finish("test_callbacks");
}
