/* Options and loader creation: validation at set time, and the status of each failure kind. */
#include "testutil.h"

/* stoker_loader_new on these options must fail with `want`, a message containing `needle`, and
 * *out NULL. */
static void expect_new_fails(stoker_options *o, stoker_status want, const char *needle) {
  stoker_loader *l = (stoker_loader *)&l; /* not NULL: the call must clear it */
  CHECK_STATUS(stoker_loader_new(o, &l), want);
  CHECK(l == NULL);
  CHECK_ERROR_HAS(needle);
  stoker_options_free(o);
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600], labels[600];
  t_write_dataset(&tmp, 10, source, labels, sizeof source);

  stoker_options *o = stoker_options_new();
  CHECK(o != NULL);
  /* Every core key with a valid value. */
  const char *ok[][2] = {
      {"source", source}, {"labels", labels},      {"batch_size", "4"},
      {"shuffle", "true"}, {"seed", "18446744073709551615"}, {"drop_last", "false"},
      {"num_workers", "auto"}, {"num_workers", "2"}, {"prefetch_factor", "3"},
      {"in_order", "false"}, {"rank", "0"},         {"world_size", "1"},
      {"pin_memory", "false"},
      {"device", "cpu"},    {"on_error", "skip"},   {"timeout_ms", "0"},
  };
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    CHECK_STATUS(stoker_options_set(o, ok[i][0], ok[i][1]), STOKER_OK);

  /* Unknown keys and malformed values fail when set, naming the key. */
  const char *bad[][3] = {
      {"batch_sise", "4", "unknown option"},
      {"batch_size", "0", "out of range"},
      {"batch_size", "-1", "not a non-negative integer"},
      {"batch_size", "", "not a non-negative integer"},
      {"shuffle", "maybe", "not a boolean"},
      {"source", "csv:/data", "not a source"},
      {"num_workers", "many", "not a non-negative integer"},
      {"device", "tpu", "not a device"},
      {"dtype", "float64", "unknown dtype"},
      {"on_error", "ignore", "not a policy"},
      {"resume_state", "not a state", "resume_state"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_STATUS(stoker_options_set(o, bad[i][0], bad[i][1]), STOKER_ERR_INVALID_ARGUMENT);
    char key[64];
    snprintf(key, sizeof key, "`%s`", bad[i][0]);
    CHECK_ERROR_HAS(key);
    CHECK_ERROR_HAS(bad[i][2]);
  }
  /* A value that is not UTF-8. */
  CHECK_STATUS(stoker_options_set(o, "seed", "\xff\xfe"), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("UTF-8");
  /* The failed sets left the good values: this loader works. */
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  CHECK(stoker_loader_batches_per_epoch(l) == 3);
  stoker_loader_free(l);
  /* The options outlive the loader and may make another. */
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);
  stoker_loader_free(l);

  /* dtype and layout are valid values, but shape image outputs only: on an npy source they are
   * an error at loader creation rather than silently ignored. */
  const char *image_only[][2] = {{"dtype", "uint8"}, {"layout", "nhwc"}};
  for (size_t i = 0; i < 2; i++) {
    o = stoker_options_new();
    CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
    CHECK_STATUS(stoker_options_set(o, image_only[i][0], image_only[i][1]), STOKER_OK);
    char key[64];
    snprintf(key, sizeof key, "`%s`", image_only[i][0]);
    expect_new_fails(o, STOKER_ERR_INVALID_ARGUMENT, key);
  }

  /* No source. */
  expect_new_fails(stoker_options_new(), STOKER_ERR_INVALID_ARGUMENT, "`source`");

  /* A missing file: IO, naming the path. */
  o = stoker_options_new();
  char missing[600];
  snprintf(missing, sizeof missing, "npy:%s/missing.npy", tmp.dir);
  CHECK_STATUS(stoker_options_set(o, "source", missing), STOKER_OK);
  expect_new_fails(o, STOKER_ERR_IO, "missing.npy");

  /* A truncated file: DECODE, naming the path and the reason. */
  uint8_t data[5 * 6] = {0};
  int64_t shape[2] = {5, 6};
  const char *trunc_path = t_tmp_path(&tmp, "truncated.npy");
  t_write_npy(trunc_path, "|u1", shape, 2, data, sizeof data, 17);
  char trunc[600];
  snprintf(trunc, sizeof trunc, "npy:%s", trunc_path);
  o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", trunc), STOKER_OK);
  expect_new_fails(o, STOKER_ERR_DECODE, "truncated.npy");
  CHECK_ERROR_HAS("truncated");

  /* Not an npy file at all: DECODE. */
  const char *garbage_path = t_tmp_path(&tmp, "garbage.npy");
  FILE *f = fopen(garbage_path, "wb");
  fputs("this is not numpy", f);
  fclose(f);
  char garbage[600];
  snprintf(garbage, sizeof garbage, "npy:%s", garbage_path);
  o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", garbage), STOKER_OK);
  expect_new_fails(o, STOKER_ERR_DECODE, "garbage.npy");

  /* device=cuda is a valid value, but with no CUDA driver here: UNSUPPORTED, saying which. (On a
   * machine with a driver and a device the loader would be made; this suite runs without.) */
  o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "device", "cuda"), STOKER_OK);
  expect_new_fails(o, STOKER_ERR_UNSUPPORTED, "device=cuda");
  CHECK_ERROR_HAS("no CUDA");

  /* labels on the wrong source length etc. are the core's; one sample: a labels file that is
   * missing is an IO error. */
  o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "labels", missing), STOKER_OK);
  expect_new_fails(o, STOKER_ERR_IO, "missing.npy");

  t_tmp_cleanup(&tmp);
  return t_finish("test_options");
}
