/* DLPack exports: the layout consumers read, and the lifetime rule (memory returns to the arena
 * only when the batch is released and every export's deleter has run, in any order). */
#include "testutil.h"

static void check_export(const DLManagedTensorVersioned *d, const stoker_tensor *t, uint8_t code,
                         uint8_t bits) {
  CHECK(d->version.major == 1 && d->version.minor == 0);
  CHECK(d->manager_ctx != NULL && d->deleter != NULL);
  CHECK(d->flags == 0);
  const DLTensor *x = &d->dl_tensor;
  CHECK(x->data == t->data && x->byte_offset == 0);
  CHECK(x->device.device_type == kDLCPU && x->device.device_id == 0);
  CHECK(x->ndim == t->ndim);
  CHECK(x->dtype.code == code && x->dtype.bits == bits && x->dtype.lanes == 1);
  for (int k = 0; k < x->ndim; k++) {
    CHECK(x->shape[k] == t->shape[k]);
    CHECK(x->strides != NULL && x->strides[k] == t->strides[k]);
  }
}

/* 12 rows of uint8 [32, 32], every byte of row r equal to r, and labels 10 * r: batches of 4
 * are big enough (4 KiB) for the arena to recycle their slabs. */
#define ROWS 12
#define ROW_BYTES (32 * 32)

static void write_data(t_tmp *tmp, char *source, char *labels, size_t cap) {
  static uint8_t data[ROWS * ROW_BYTES];
  int64_t label[ROWS];
  for (int r = 0; r < ROWS; r++) {
    memset(data + r * ROW_BYTES, r, ROW_BYTES);
    label[r] = 10 * r;
  }
  int64_t shape[3] = {ROWS, 32, 32};
  const char *dp = t_tmp_path(tmp, "big.npy"), *lp = t_tmp_path(tmp, "big_labels.npy");
  t_write_npy(dp, "|u1", shape, 3, data, sizeof data, sizeof data);
  t_write_npy(lp, "<i8", shape, 1, label, sizeof label, sizeof label);
  snprintf(source, cap, "npy:%s", dp);
  snprintf(labels, cap, "npy:%s", lp);
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600], labels[600];
  write_data(&tmp, source, labels, sizeof source);

  /* num_workers=0: each batch is built in stoker_loader_next, from the arena's free slabs. */
  stoker_loader *l = t_loader(source, labels, "batch_size", "4", "num_workers", "0", NULL);
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  stoker_tensor data, label;
  CHECK_STATUS(stoker_batch_field(b, 0, &data), STOKER_OK);
  CHECK_STATUS(stoker_batch_field(b, 1, &label), STOKER_OK);

  DLManagedTensorVersioned *d0 = NULL, *d0b = NULL, *d1 = NULL;
  CHECK_STATUS(stoker_batch_to_dlpack(b, 0, &d0), STOKER_OK);
  CHECK_STATUS(stoker_batch_to_dlpack(b, 0, &d0b), STOKER_OK);
  CHECK_STATUS(stoker_batch_to_dlpack(b, 1, &d1), STOKER_OK);
  CHECK(d0 && d0b && d1 && d0 != d0b);
  DLManagedTensorVersioned *bad = (DLManagedTensorVersioned *)&bad;
  CHECK_STATUS(stoker_batch_to_dlpack(b, 2, &bad), STOKER_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  CHECK_ERROR_HAS("out of range");
  check_export(d0, &data, kDLUInt, 8);
  check_export(d1, &label, kDLInt, 64);

  /* One deleter runs before the batch is released, the others after. */
  d0b->deleter(d0b);
  void *slab = data.data;
  stoker_batch_release(b);
  /* The exports still hold the memory: the next batch gets other memory, and the data is intact. */
  stoker_batch *b2 = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b2), STOKER_OK);
  stoker_tensor data2;
  CHECK_STATUS(stoker_batch_field(b2, 0, &data2), STOKER_OK);
  CHECK(data2.data != slab);
  const uint8_t *px = (const uint8_t *)d0->dl_tensor.data;
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < ROW_BYTES; j++) CHECK(px[r * ROW_BYTES + j] == r);
  CHECK(((const int64_t *)d1->dl_tensor.data)[3] == 30);
  /* A consumer may write through an export (the batch owns its memory exclusively). */
  ((uint8_t *)d0->dl_tensor.data)[0] = 200;
  d1->deleter(d1);
  d0->deleter(d0);
  stoker_batch_release(b2);
  /* Now both slabs are back in the arena and the next batch reuses one of them. */
  stoker_batch *b3 = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b3), STOKER_OK);
  stoker_tensor data3;
  CHECK_STATUS(stoker_batch_field(b3, 0, &data3), STOKER_OK);
  CHECK(data3.data == slab || data3.data == data2.data);
  CHECK(data3.shape[0] == 4 && ((const uint8_t *)data3.data)[0] == 8);

  /* An export that outlives both its batch and its loader. */
  DLManagedTensorVersioned *late = NULL;
  CHECK_STATUS(stoker_batch_to_dlpack(b3, 1, &late), STOKER_OK);
  stoker_loader_free(l);
  stoker_batch_release(b3);
  CHECK(late->dl_tensor.shape[0] == 4);
  CHECK(((const int64_t *)late->dl_tensor.data)[1] == 90);
  late->deleter(late);

  t_tmp_cleanup(&tmp);
  return t_finish("test_dlpack");
}
