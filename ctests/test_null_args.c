/* Every pointer argument of every function: NULL gives STOKER_ERR_INVALID_ARGUMENT (or the
 * documented neutral value), a message naming the argument, and never a crash. Every destroy
 * function accepts NULL. */
#include "testutil.h"

#define CHECK_NULL_ARG(call, arg)                                                    \
  do {                                                                               \
    CHECK_STATUS(call, STOKER_ERR_INVALID_ARGUMENT);                                 \
    CHECK_ERROR_HAS("argument `" arg "` is NULL");                                   \
  } while (0)

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600];
  t_write_dataset(&tmp, 6, source, NULL, sizeof source);

  /* Destroy functions. */
  stoker_options_free(NULL);
  stoker_loader_free(NULL);
  stoker_batch_release(NULL);

  /* Options. */
  stoker_options *o = stoker_options_new();
  CHECK_NULL_ARG(stoker_options_set(NULL, "seed", "1"), "o");
  CHECK_NULL_ARG(stoker_options_set(o, NULL, "1"), "key");
  CHECK_NULL_ARG(stoker_options_set(o, "seed", NULL), "value");
  CHECK_ERROR_HAS("stoker_options_set");
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "batch_size", "4"), STOKER_OK);

  /* Loader creation: out is cleared first. */
  stoker_loader *l = (stoker_loader *)&l;
  CHECK_NULL_ARG(stoker_loader_new(NULL, &l), "o");
  CHECK(l == NULL);
  CHECK_NULL_ARG(stoker_loader_new(o, NULL), "out");
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);

  /* Loader. */
  stoker_batch *b = (stoker_batch *)&b;
  CHECK_NULL_ARG(stoker_loader_next(NULL, &b), "l");
  CHECK(b == NULL);
  CHECK_NULL_ARG(stoker_loader_next(l, NULL), "out");
  CHECK(stoker_loader_batches_per_epoch(NULL) == -1);
  CHECK(stoker_loader_epoch(NULL) == 0);
  stoker_stats stats;
  stats.size = sizeof stats;
  CHECK_NULL_ARG(stoker_loader_stats(NULL, &stats), "l");
  CHECK_NULL_ARG(stoker_loader_close(NULL), "l");
  CHECK_NULL_ARG(stoker_loader_stats(l, NULL), "out");
  size_t needed = 0;
  char state[256];
  CHECK_NULL_ARG(stoker_loader_save_state(NULL, state, sizeof state, &needed), "l");
  CHECK_NULL_ARG(stoker_loader_save_state(l, state, sizeof state, NULL), "needed");
  CHECK_STATUS(stoker_loader_save_state(l, NULL, 10, &needed), STOKER_ERR_INVALID_ARGUMENT);

  /* Batch. */
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  CHECK(stoker_batch_num_fields(NULL) == 0);
  stoker_tensor t;
  CHECK_NULL_ARG(stoker_batch_field(NULL, 0, &t), "b");
  CHECK(t.data == NULL && t.name == NULL && t.ndim == 0); /* zeroed on failure */
  CHECK_NULL_ARG(stoker_batch_field(b, 0, NULL), "out");
  CHECK_NULL_ARG(stoker_batch_field_by_name(NULL, "data", &t), "b");
  CHECK_NULL_ARG(stoker_batch_field_by_name(b, NULL, &t), "name");
  CHECK(t.data == NULL);
  CHECK_NULL_ARG(stoker_batch_field_by_name(b, "data", NULL), "out");
  DLManagedTensorVersioned *d = (DLManagedTensorVersioned *)&d;
  CHECK_NULL_ARG(stoker_batch_to_dlpack(NULL, 0, &d), "b");
  CHECK(d == NULL);
  CHECK_NULL_ARG(stoker_batch_to_dlpack(b, 0, NULL), "out");

  /* Still fully usable after all that. */
  CHECK(stoker_batch_num_fields(b) == 1);
  CHECK_STATUS(stoker_batch_field(b, 0, &t), STOKER_OK);
  stoker_batch_release(b);
  stoker_loader_free(l);
  t_tmp_cleanup(&tmp);
  return t_finish("test_null_args");
}
