/* A downstream program: checks the library it was linked with and runs one epoch.
 * Usage: consumer [FILE.npy] (writes and uses a temporary dataset when none is given) */
#include "testutil.h"

int main(int argc, char **argv) {
  printf("stoker %s, ABI %u (header: %s, ABI %d)\n", stoker_version(), stoker_abi_version(),
         STOKER_VERSION, STOKER_ABI_VERSION);
  CHECK(stoker_abi_version() == STOKER_ABI_VERSION);
  CHECK(strcmp(stoker_version(), STOKER_VERSION) == 0);

  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600];
  if (argc > 1)
    snprintf(source, sizeof source, "npy:%s", argv[1]);
  else
    t_write_dataset(&tmp, 10, source, NULL, sizeof source);
  stoker_loader *l = t_loader(source, NULL, "batch_size", "4", "shuffle", "true", NULL);
  int samples = 0;
  stoker_batch *b = NULL;
  stoker_status s;
  while ((s = stoker_loader_next(l, &b)) == STOKER_OK) {
    stoker_tensor t;
    CHECK_STATUS(stoker_batch_field(b, 0, &t), STOKER_OK);
    samples += (int)t.shape[0];
    stoker_batch_release(b);
  }
  CHECK_STATUS(s, STOKER_END_OF_EPOCH);
  printf("one epoch: %d samples\n", samples);
  stoker_loader_free(l);
  t_tmp_cleanup(&tmp);
  return t_finish("consumer");
}
