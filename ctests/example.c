/* Iterate two epochs of shuffled batches from a .npy file.
 *   cc example.c -o example $(pkg-config --cflags --libs stoker)
 *   ./example data.npy                                                      */
#include <stdio.h>
#include <stoker.h>

static int fail(const char *what) {
  char msg[512];
  stoker_last_error(msg, sizeof msg); /* this thread's last error, truncated to fit */
  fprintf(stderr, "%s: %s\n", what, msg);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FILE.npy\n", argv[0]);
    return 2;
  }
  char source[4096];
  snprintf(source, sizeof source, "npy:%s", argv[1]);

  /* Options are string keys, validated when set. */
  stoker_options *opts = stoker_options_new();
  stoker_loader *loader = NULL;
  stoker_status status = stoker_options_set(opts, "source", source);
  if (status == STOKER_OK) status = stoker_options_set(opts, "batch_size", "4");
  if (status == STOKER_OK) status = stoker_options_set(opts, "shuffle", "true");
  if (status == STOKER_OK) status = stoker_loader_new(opts, &loader);
  stoker_options_free(opts);
  if (status != STOKER_OK) return fail("creating the loader");

  for (int epoch = 0; epoch < 2; epoch++) {
    stoker_batch *batch;
    while ((status = stoker_loader_next(loader, &batch)) == STOKER_OK) {
      stoker_tensor data; /* field "data": [batch, ...] of the file's dtype */
      stoker_batch_field_by_name(batch, "data", &data);
      printf("epoch %d: batch of %lld, first byte %u\n", epoch, (long long)data.shape[0],
             (unsigned)((const unsigned char *)data.data)[0]);
      stoker_batch_release(batch); /* its memory goes back to the loader's arena */
    }
    if (status != STOKER_END_OF_EPOCH) {
      fail("stoker_loader_next");
      stoker_loader_free(loader);
      return 1;
    }
  }
  stoker_loader_free(loader); /* joins the worker threads */
  return 0;
}
