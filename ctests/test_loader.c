/* The loader: epochs, END_OF_EPOCH, batch contents, fields, shuffling, worker counts. */
#include "testutil.h"

#define ROWS 10

/* Runs one epoch; checks every batch and END_OF_EPOCH; returns the rows in delivery order. */
static int run_epoch(stoker_loader *l, int64_t *rows, int expect_batches) {
  int n = 0, batches = 0;
  for (;;) {
    stoker_batch *b = (stoker_batch *)&b;
    stoker_status s = stoker_loader_next(l, &b);
    if (s == STOKER_END_OF_EPOCH) {
      CHECK(b == NULL);
      break;
    }
    CHECK_STATUS(s, STOKER_OK);
    if (s != STOKER_OK) break;
    n += t_batch_rows(b, rows + n);
    batches++;
    stoker_batch_release(b);
  }
  CHECK(batches == expect_batches);
  return n;
}

static int is_permutation(const int64_t *rows, int n, int total) {
  int seen[64] = {0};
  for (int i = 0; i < n; i++) {
    if (rows[i] < 0 || rows[i] >= total || seen[rows[i]]++) return 0;
  }
  return n == total;
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600], labels[600];
  t_write_dataset(&tmp, ROWS, source, labels, sizeof source);

  /* Sequential, batch 4 of 10: 4, 4, 2; the epoch counter moves at END_OF_EPOCH. */
  stoker_loader *l = t_loader(source, labels, "batch_size", "4", "num_workers", "2", NULL);
  CHECK(stoker_loader_batches_per_epoch(l) == 3);
  CHECK(stoker_loader_epoch(l) == 0);
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  CHECK(stoker_batch_num_fields(b) == 2);
  stoker_tensor t;
  CHECK_STATUS(stoker_batch_field(b, 0, &t), STOKER_OK);
  CHECK(strcmp(t.name, "data") == 0);
  CHECK(t.dtype == STOKER_DTYPE_U8);
  CHECK(t.device_type == 1 && t.device_id == 0);
  CHECK(t.ndim == 3 && t.shape[0] == 4 && t.shape[1] == 2 && t.shape[2] == 3);
  CHECK(t.strides[0] == 6 && t.strides[1] == 3 && t.strides[2] == 1);
  const uint8_t *px = (const uint8_t *)t.data;
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < T_ROW; j++) CHECK(px[r * T_ROW + j] == t_value(r, j));
  CHECK_STATUS(stoker_batch_field(b, 1, &t), STOKER_OK);
  CHECK(strcmp(t.name, "label") == 0);
  CHECK(t.dtype == STOKER_DTYPE_I64 && t.ndim == 1 && t.shape[0] == 4 && t.strides[0] == 1);
  const int64_t *lab = (const int64_t *)t.data;
  for (int r = 0; r < 4; r++) CHECK(lab[r] == 10 * r);
  stoker_tensor by_name;
  CHECK_STATUS(stoker_batch_field_by_name(b, "label", &by_name), STOKER_OK);
  CHECK(by_name.data == t.data && by_name.name == t.name);
  /* Bad field index and name. */
  CHECK_STATUS(stoker_batch_field(b, 2, &t), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("out of range");
  CHECK(t.data == NULL && t.name == NULL);
  CHECK_STATUS(stoker_batch_field_by_name(b, "image", &t), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("`image`");
  CHECK(t.data == NULL);
  stoker_batch_release(b);

  int64_t rows[64];
  int n = 4 + run_epoch(l, rows + 4, 2);
  for (int i = 0; i < 4; i++) rows[i] = i;
  CHECK(n == ROWS);
  for (int i = 0; i < n; i++) CHECK(rows[i] == i);
  CHECK(stoker_loader_epoch(l) == 1);
  /* The call after END_OF_EPOCH starts the next epoch. */
  CHECK(run_epoch(l, rows, 3) == ROWS);
  for (int i = 0; i < ROWS; i++) CHECK(rows[i] == i);
  CHECK(stoker_loader_epoch(l) == 2);
  stoker_loader_free(l);

  /* drop_last drops the short batch. */
  l = t_loader(source, NULL, "batch_size", "4", "drop_last", "true", NULL);
  CHECK(stoker_loader_batches_per_epoch(l) == 2);
  CHECK(run_epoch(l, rows, 2) == 8);
  stoker_loader_free(l);

  /* Shuffle: each epoch a permutation; the same seed gives the same order whatever num_workers
   * is; another epoch gives another order. */
  int64_t a0[64], a1[64], c0[64];
  l = t_loader(source, NULL, "batch_size", "3", "shuffle", "true", "seed", "7", "num_workers", "2",
               NULL);
  CHECK(run_epoch(l, a0, 4) == ROWS && is_permutation(a0, ROWS, ROWS));
  CHECK(run_epoch(l, a1, 4) == ROWS && is_permutation(a1, ROWS, ROWS));
  CHECK(memcmp(a0, a1, sizeof(int64_t) * ROWS) != 0);
  stoker_loader_free(l);
  l = t_loader(source, NULL, "batch_size", "3", "shuffle", "true", "seed", "7", "num_workers", "0",
               NULL);
  CHECK(run_epoch(l, c0, 4) == ROWS);
  CHECK(memcmp(a0, c0, sizeof(int64_t) * ROWS) == 0);
  stoker_loader_free(l);

  /* num_workers=0 and in_order=false with many workers deliver every sample too. */
  l = t_loader(source, NULL, "batch_size", "2", "num_workers", "0", NULL);
  CHECK(run_epoch(l, rows, 5) == ROWS);
  stoker_loader_free(l);
  l = t_loader(source, NULL, "batch_size", "1", "num_workers", "3", "in_order", "false",
               "prefetch_factor", "4", NULL);
  CHECK(run_epoch(l, rows, ROWS) == ROWS && is_permutation(rows, ROWS, ROWS));
  stoker_loader_free(l);

  t_tmp_cleanup(&tmp);
  return t_finish("test_loader");
}
