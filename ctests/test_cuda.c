/* CUDA through the C ABI on any machine: device=cuda without a driver fails at stoker_loader_new
 * with STOKER_ERR_UNSUPPORTED naming what is missing; the device-batch functions on a host batch
 * give NULL event and stream and wait/synchronize are no-ops; NULL arguments; the cuda_stream
 * option. (Device batches themselves are tested in Rust against a fake device, and on a machine
 * with a GPU by the smoke test below.) */
#include <dlfcn.h>

#include "testutil.h"

/* Whether the CUDA driver library can be loaded here. */
static int have_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) lib = dlopen("libcuda.so", RTLD_LAZY | RTLD_LOCAL);
  if (!lib) return 0;
  dlclose(lib);
  return 1;
}

/* A loader with device=`device` over the standard dataset: NULL and the last error set when it
 * cannot be made. */
static stoker_status cuda_loader(const char *source, const char *device, stoker_loader **l) {
  stoker_options *o = t_options(source, NULL, "batch_size", "4", "device", device, NULL);
  *l = (stoker_loader *)l;
  stoker_status s = stoker_loader_new(o, l);
  stoker_options_free(o);
  return s;
}

/* On a machine with a GPU: one device batch, end to end, without touching its memory. */
static void device_smoke_test(stoker_loader *l) {
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  if (!b) return;
  stoker_tensor t;
  CHECK_STATUS(stoker_batch_field(b, 0, &t), STOKER_OK);
  CHECK(t.device_type == 2 && t.data != NULL);
  CHECK(t.ndim == 3 && t.shape[0] == 4);
  void *event = NULL, *stream = NULL;
  CHECK_STATUS(stoker_batch_cuda_event(b, &event), STOKER_OK);
  CHECK_STATUS(stoker_batch_cuda_stream(b, &stream), STOKER_OK);
  CHECK(event != NULL && stream != NULL);
  CHECK_STATUS(stoker_batch_wait(b, NULL), STOKER_OK); /* the legacy default stream */
  CHECK_STATUS(stoker_batch_synchronize(b), STOKER_OK);
  DLManagedTensorVersioned *d = NULL;
  CHECK_STATUS(stoker_batch_to_dlpack(b, 0, &d), STOKER_OK);
  if (d) {
    CHECK(d->dl_tensor.device.device_type == kDLCUDA);
    CHECK(d->dl_tensor.device.device_id == t.device_id);
    d->deleter(d);
  }
  stoker_batch_release(b);
}

/* device=`device` fails without a driver, or works (or names the missing device) with one. */
static void check_device(const char *source, const char *device, const char *canonical,
                         int driver) {
  stoker_loader *l = NULL;
  stoker_status s = cuda_loader(source, device, &l);
  if (!driver) {
    CHECK_STATUS(s, STOKER_ERR_UNSUPPORTED);
    CHECK_ERROR_HAS(canonical);
    CHECK_ERROR_HAS("no CUDA driver (libcuda.so) found");
    CHECK(l == NULL);
  } else if (s == STOKER_OK) {
    printf("%s: a CUDA device is present, running the smoke test\n", device);
    device_smoke_test(l);
  } else {
    /* A driver without a GPU, or without that many. */
    CHECK_STATUS(s, STOKER_ERR_UNSUPPORTED);
    CHECK_ERROR_HAS(canonical);
    CHECK(l == NULL);
  }
  stoker_loader_free(l);
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600], labels[600];
  t_write_dataset(&tmp, 10, source, labels, sizeof source);
  int driver = have_driver();
  printf("CUDA driver %s\n", driver ? "present" : "absent");

  /* device=cuda and cuda:N: the error comes from stoker_loader_new, naming the device. */
  check_device(source, "cuda", "device=cuda:0", driver);
  check_device(source, "cuda:1", "device=cuda:1", driver);

  /* The options: a borrowed stream is accepted (its value is only used by a CUDA loader), and is
   * ignored by a loader on the CPU. NULL means the legacy default stream. */
  stoker_options *o = t_options(source, labels, "batch_size", "4", NULL);
  CHECK_STATUS(stoker_options_set_cuda_stream(o, (void *)0x1234), STOKER_OK);
  CHECK_STATUS(stoker_options_set_cuda_stream(o, NULL), STOKER_OK);
  CHECK_STATUS(stoker_options_set_cuda_stream(o, (void *)0x1234), STOKER_OK);
  CHECK_STATUS(stoker_options_set_cuda_stream(NULL, (void *)0x1234), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("stoker_options_set_cuda_stream: argument `o` is NULL");
  stoker_loader *l = t_loader_from(o);

  /* A host batch: no event, no stream; wait and synchronize succeed and do nothing. */
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  if (!b) return t_finish("test_cuda");
  void *event = (void *)&event, *stream = (void *)&stream;
  CHECK_STATUS(stoker_batch_cuda_event(b, &event), STOKER_OK);
  CHECK(event == NULL);
  CHECK_STATUS(stoker_batch_cuda_stream(b, &stream), STOKER_OK);
  CHECK(stream == NULL);
  CHECK_STATUS(stoker_batch_wait(b, NULL), STOKER_OK);
  CHECK_STATUS(stoker_batch_wait(b, (void *)0x1234), STOKER_OK);
  CHECK_STATUS(stoker_batch_synchronize(b), STOKER_OK);
  stoker_tensor t;
  CHECK_STATUS(stoker_batch_field(b, 0, &t), STOKER_OK);
  CHECK(t.device_type == 1 && t.device_id == 0);
  int64_t rows[4];
  CHECK(t_batch_rows(b, rows) == 4); /* the data is untouched */
  for (int i = 0; i < 4; i++) CHECK(rows[i] == i);

  /* NULL arguments: STOKER_ERR_INVALID_ARGUMENT naming the argument; out-pointers cleared. */
  event = (void *)&event;
  CHECK_STATUS(stoker_batch_cuda_event(NULL, &event), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("stoker_batch_cuda_event: argument `b` is NULL");
  CHECK(event == NULL);
  CHECK_STATUS(stoker_batch_cuda_event(b, NULL), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("argument `event_out` is NULL");
  stream = (void *)&stream;
  CHECK_STATUS(stoker_batch_cuda_stream(NULL, &stream), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("stoker_batch_cuda_stream: argument `b` is NULL");
  CHECK(stream == NULL);
  CHECK_STATUS(stoker_batch_cuda_stream(b, NULL), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("argument `stream_out` is NULL");
  CHECK_STATUS(stoker_batch_wait(NULL, NULL), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("stoker_batch_wait: argument `b` is NULL");
  CHECK_STATUS(stoker_batch_synchronize(NULL), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("stoker_batch_synchronize: argument `b` is NULL");

  stoker_batch_release(b);
  stoker_loader_free(l);
  t_tmp_cleanup(&tmp);
  return t_finish("test_cuda");
}
