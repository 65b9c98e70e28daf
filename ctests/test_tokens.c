/* Token streams from C: a flat uint16 token file cut into windows of seq_len + 1 tokens
 * (input_ids, labels), global batches the same at world sizes 1, 2 and 4, a resume state saved at
 * 2 ranks resumed at 4, and a truncated file named at open. */
#include "testutil.h"

#define TOKENS 1001 /* 62 windows of 16 (+1) tokens */
#define SEQ 16
#define GLOBAL 8

static uint16_t token(int64_t k) { return (uint16_t)((k * 13 + 5) % 50000); }

/* The int64 field `name` of b: its rows and their width. */
static const int64_t *rows(const stoker_batch *b, const char *name, int64_t *count, int64_t *width) {
  stoker_tensor t;
  CHECK_STATUS(stoker_batch_field_by_name(b, name, &t), STOKER_OK);
  CHECK(t.dtype == STOKER_DTYPE_I64 && t.ndim == 2);
  *count = t.shape[0];
  *width = t.shape[1];
  return (const int64_t *)t.data;
}

/* A loader of rank `rank` of `world` over `source`, `batch` samples a micro-batch. */
static stoker_loader *ranked(const char *source, int rank, int world, int batch, const char *state) {
  char r[16], w[16], b[16], g[16];
  snprintf(r, sizeof r, "%d", rank);
  snprintf(w, sizeof w, "%d", world);
  snprintf(b, sizeof b, "%d", batch);
  snprintf(g, sizeof g, "%d", GLOBAL);
  stoker_options *o = t_options(source, NULL, "token_dtype", "uint16", "seq_len", "16",
                                "global_batch_size", g, "batch_size", b, "rank", r,
                                "world_size", w, "shuffle", "true", "seed", "9", NULL);
  if (state) CHECK_STATUS(stoker_options_set(o, "resume_state", state), STOKER_OK);
  return t_loader_from(o);
}

/* The first token of each of the next `steps` global batches' samples, in order, read by `world`
 * ranks in micro-batches of `batch`; `state_out` (if not NULL) gets rank 0's state after them. */
static void global_steps(const char *source, int world, int batch, int steps, const char *state,
                         int64_t *out, char *state_out, size_t state_size) {
  stoker_loader *ranks[4];
  for (int r = 0; r < world; r++) ranks[r] = ranked(source, r, world, batch, state);
  int share = GLOBAL / world, n = 0;
  for (int s = 0; s < steps; s++) {
    for (int r = 0; r < world; r++) {
      for (int got = 0; got < share;) {
        stoker_batch *b = NULL;
        stoker_status st = stoker_loader_next(ranks[r], &b);
        if (st == STOKER_END_OF_EPOCH) continue;
        CHECK_STATUS(st, STOKER_OK);
        if (st != STOKER_OK) return;
        int64_t count, width;
        const int64_t *ids = rows(b, "input_ids", &count, &width);
        for (int64_t i = 0; i < count; i++) out[n++] = ids[i * width];
        got += (int)count;
        stoker_batch_release(b);
      }
    }
  }
  if (state_out) {
    size_t needed = 0;
    CHECK_STATUS(stoker_loader_save_state(ranks[0], state_out, state_size, &needed), STOKER_OK);
    for (int r = 1; r < world; r++) {
      char other[1024];
      CHECK_STATUS(stoker_loader_save_state(ranks[r], other, sizeof other, &needed), STOKER_OK);
      CHECK(strcmp(other, state_out) == 0); /* the same state on every rank */
    }
  }
  for (int r = 0; r < world; r++) stoker_loader_free(ranks[r]);
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  const char *path = t_tmp_path(&tmp, "train.bin");
  uint16_t tokens[TOKENS];
  for (int64_t k = 0; k < TOKENS; k++) tokens[k] = token(k);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL && fwrite(tokens, sizeof tokens[0], TOKENS, f) == TOKENS);
  fclose(f);
  char source[600];
  snprintf(source, sizeof source, "tokens:%s", path);

  /* In order: sample i is tokens i*16 .. i*16+16, the labels shifted by one. An epoch is whole
   * global batches (here batch_size 5 on one rank): 12 of the 62 samples' 13 batches. */
  stoker_loader *l = t_loader(source, NULL, "token_dtype", "uint16", "seq_len", "16",
                              "batch_size", "5", "num_workers", "2", NULL);
  CHECK(stoker_loader_batches_per_epoch(l) == 12);
  int64_t sample = 0;
  for (;;) {
    stoker_batch *b = NULL;
    stoker_status st = stoker_loader_next(l, &b);
    if (st == STOKER_END_OF_EPOCH) break;
    CHECK_STATUS(st, STOKER_OK);
    if (st != STOKER_OK) break;
    int64_t count, width, lcount, lwidth;
    const int64_t *ids = rows(b, "input_ids", &count, &width);
    const int64_t *labels = rows(b, "labels", &lcount, &lwidth);
    CHECK(width == SEQ && lwidth == SEQ && lcount == count);
    for (int64_t i = 0; i < count; i++, sample++)
      for (int64_t k = 0; k < SEQ; k++) {
        CHECK(ids[i * SEQ + k] == token(sample * SEQ + k));
        CHECK(labels[i * SEQ + k] == token(sample * SEQ + k + 1));
      }
    stoker_batch_release(b);
  }
  CHECK(sample == 60);
  stoker_loader_free(l);

  /* Global batches: one process, 2 ranks, 4 ranks; 2 ranks saved after 2 steps resume at 4. */
  int64_t one[4 * GLOBAL], two[4 * GLOBAL], resumed[2 * GLOBAL];
  char state[1024];
  global_steps(source, 1, GLOBAL, 4, NULL, one, NULL, 0);
  global_steps(source, 2, 2, 4, NULL, two, NULL, 0);
  CHECK(memcmp(one, two, sizeof one) == 0);
  global_steps(source, 2, 4, 2, NULL, two, state, sizeof state);
  global_steps(source, 4, 1, 2, state, resumed, NULL, 0);
  CHECK(memcmp(one + 2 * GLOBAL, resumed, sizeof resumed) == 0);

  /* A file that is not a whole number of tokens is named at open. */
  const char *odd = t_tmp_path(&tmp, "odd.bin");
  f = fopen(odd, "wb");
  CHECK(f != NULL && fwrite(tokens, 1, 7, f) == 7);
  fclose(f);
  snprintf(source, sizeof source, "tokens:%s", odd);
  stoker_options *o = t_options(source, NULL, "token_dtype", "uint16", "seq_len", "2", NULL);
  stoker_loader *bad = NULL;
  CHECK_STATUS(stoker_loader_new(o, &bad), STOKER_ERR_DECODE);
  CHECK(bad == NULL);
  CHECK_ERROR_HAS("odd.bin");
  CHECK_ERROR_HAS("not a whole number");
  stoker_options_free(o);

  t_tmp_cleanup(&tmp);
  return t_finish("test_tokens");
}
