/* The image pipeline through the C API: an image_folder of real photographs decoded and
 * transformed into float32 NCHW batches; corrupt and empty files fail with STOKER_ERR_DECODE
 * naming the file, or are replaced and counted under on_error=skip; encoded samples given
 * through callbacks come out pixel for pixel like the same files through image_folder.
 *   test_images FIXTURE_DIR   (crates/stoker-core/tests/data/images) */
#include <sys/stat.h>

#include "testutil.h"

static const char *fixtures;

static size_t read_file(const char *path, unsigned char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    exit(2);
  }
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

static void write_file(const char *path, const unsigned char *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  fwrite(bytes, 1, n, f);
  fclose(f);
}

static unsigned char photo[2][200000];
static size_t photo_len[2];

/* class_a/0.jpg, class_a/1.jpg (real photographs) and, with `bad`, class_b/corrupt.jpg (half a
 * JPEG) and class_b/empty.jpg (0 bytes). */
static void make_folder(t_tmp *t, char paths[2][512], int bad) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/class_a", t->dir);
  mkdir(dir, 0700);
  if (bad) { /* an empty class folder is an error, as in torchvision's ImageFolder */
    snprintf(dir, sizeof dir, "%s/class_b", t->dir);
    mkdir(dir, 0700);
  }
  const char *names[2] = {"class_a/0.jpg", "class_a/1.jpg"};
  for (int i = 0; i < 2; i++) {
    snprintf(paths[i], 512, "%s", t_tmp_path(t, names[i]));
    write_file(paths[i], photo[i], photo_len[i]);
  }
  if (bad) {
    write_file(t_tmp_path(t, "class_b/corrupt.jpg"), photo[0], photo_len[0] / 2);
    write_file(t_tmp_path(t, "class_b/empty.jpg"), photo[0], 0);
  }
}

static void remove_folder(t_tmp *t) {
  for (int i = 0; i < t->nfiles; i++) unlink(t->files[i]);
  t->nfiles = 0;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/class_a", t->dir);
  rmdir(dir);
  snprintf(dir, sizeof dir, "%s/class_b", t->dir);
  rmdir(dir);
  t_tmp_cleanup(t);
}

static stoker_loader *image_loader(const char *root, const char *on_error) {
  char source[600];
  snprintf(source, sizeof source, "image_folder:%s", root);
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "transform", "random_resized_crop(32) | hflip | normalize(imagenet)"),
               STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "batch_size", "2"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "num_workers", "2"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "on_error", on_error), STOKER_OK);
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);
  return l;
}

/* The callbacks: the two photographs, labels 0. */
static uint64_t cb_len(void *user) {
  (void)user;
  return 2;
}
static int32_t cb_read(void *user, uint64_t index, stoker_sample *s) {
  (void)user;
  if (stoker_sample_put_encoded(s, photo[index], photo_len[index]) != STOKER_OK) return 1;
  return stoker_sample_put_label(s, 0) == STOKER_OK ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
    return 2;
  }
  fixtures = argv[1];
  const char *names[2] = {"photo_baseline.jpg", "photo_progressive.jpg"};
  for (int i = 0; i < 2; i++) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", fixtures, names[i]);
    photo_len[i] = read_file(path, photo[i], sizeof photo[i]);
    CHECK(photo_len[i] > 1000 && photo_len[i] < sizeof photo[i]);
  }

  /* Good files: one batch of float32 [2, 3, 32, 32] and labels [2]. */
  t_tmp good;
  t_tmp_init(&good);
  char paths[2][512];
  make_folder(&good, paths, 0);
  stoker_loader *l = image_loader(good.dir, "raise");
  if (l == NULL) return t_finish("test_images");
  CHECK(stoker_loader_batches_per_epoch(l) == 1);
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  stoker_tensor image, label;
  CHECK_STATUS(stoker_batch_field(b, 0, &image), STOKER_OK);
  CHECK_STATUS(stoker_batch_field(b, 1, &label), STOKER_OK);
  CHECK(strcmp(image.name, "image") == 0 && strcmp(label.name, "label") == 0);
  CHECK(image.dtype == STOKER_DTYPE_F32 && image.ndim == 4);
  CHECK(image.shape[0] == 2 && image.shape[1] == 3 && image.shape[2] == 32 && image.shape[3] == 32);
  CHECK(image.strides[0] == 3 * 32 * 32 && image.strides[3] == 1);
  CHECK(label.dtype == STOKER_DTYPE_I64 && ((int64_t *)label.data)[0] == 0);
  /* Normalized photographs: values mostly within a few standard deviations of 0. */
  const float *px = image.data;
  double sum = 0;
  for (int i = 0; i < 2 * 3 * 32 * 32; i++) sum += px[i];
  CHECK(sum / (2 * 3 * 32 * 32) > -3.0 && sum / (2 * 3 * 32 * 32) < 3.0);

  /* The same photographs through callbacks: the same pixels. */
  stoker_source_callbacks cb = {NULL, cb_len, cb_read, NULL};
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set_source_callbacks(o, &cb), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "transform", "random_resized_crop(32) | hflip | normalize(imagenet)"),
               STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "batch_size", "2"), STOKER_OK);
  stoker_loader *lc = NULL;
  CHECK_STATUS(stoker_loader_new(o, &lc), STOKER_OK);
  stoker_options_free(o);
  stoker_batch *bc = NULL;
  CHECK_STATUS(stoker_loader_next(lc, &bc), STOKER_OK);
  stoker_tensor image_cb;
  CHECK_STATUS(stoker_batch_field_by_name(bc, "image", &image_cb), STOKER_OK);
  CHECK(memcmp(image_cb.data, image.data, sizeof(float) * 2 * 3 * 32 * 32) == 0);
  stoker_batch_release(bc);
  stoker_loader_free(lc);
  stoker_batch_release(b);
  stoker_loader_free(l);

  /* Corrupt and empty files: raise names the file; skip replaces and counts them. */
  t_tmp bad;
  t_tmp_init(&bad);
  make_folder(&bad, paths, 1);
  l = image_loader(bad.dir, "raise");
  int decode_errors = 0;
  stoker_status st;
  while ((st = stoker_loader_next(l, &b)) != STOKER_END_OF_EPOCH) {
    if (st == STOKER_OK) {
      stoker_batch_release(b);
      continue;
    }
    CHECK_STATUS(st, STOKER_ERR_DECODE);
    const char *msg = t_last_error();
    CHECK(strstr(msg, "corrupt.jpg") != NULL || strstr(msg, "empty.jpg") != NULL);
    decode_errors++;
  }
  CHECK(decode_errors == 1); /* both bad files are in the second batch: one error for it */
  stoker_loader_free(l);

  l = image_loader(bad.dir, "skip");
  int samples = 0;
  while ((st = stoker_loader_next(l, &b)) == STOKER_OK) {
    stoker_tensor t;
    CHECK_STATUS(stoker_batch_field(b, 0, &t), STOKER_OK);
    samples += (int)t.shape[0];
    stoker_batch_release(b);
  }
  CHECK_STATUS(st, STOKER_END_OF_EPOCH);
  CHECK(samples == 4);
  stoker_stats stats;
  memset(&stats, 0, sizeof stats);
  stats.size = sizeof stats;
  CHECK_STATUS(stoker_loader_stats(l, &stats), STOKER_OK);
  /* Both bad files, and a replacement drawn bad is replaced and counted again. */
  CHECK(stats.samples_skipped >= 2);
  stoker_loader_free(l);

  /* A malformed transform is an invalid option naming the key, when it is set. */
  o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "transform", "random_resized_crop(oops"), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("transform");
  CHECK_ERROR_HAS("missing closing parenthesis");
  char source[600];
  snprintf(source, sizeof source, "image_folder:%s", good.dir);
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  stoker_loader *none = NULL;
  /* What depends on the source is checked when the loader is made: this one has no images. */
  CHECK_STATUS(stoker_options_set(o, "transform", "fields(image=nothing, mask=also) | resize(8, 8)"), STOKER_OK);
  CHECK_STATUS(stoker_loader_new(o, &none), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("transform");
  CHECK(none == NULL);
  stoker_options_free(o);

  /* Augmentations: the same batch bytes with 1 and 3 workers (keyed by the draw, not the
   * worker), the erased box written as 0 after normalize, and a bad parameter naming the op. */
  const char *recipe =
      "random_resized_crop(32) | hflip | trivial_augment | color_jitter(brightness=0.4, hue=0.1) "
      "| random_erasing(p=1, value=0) | normalize(imagenet)";
  float first[2 * 3 * 32 * 32];
  for (int run = 0; run < 2; run++) {
    o = stoker_options_new();
    CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
    CHECK_STATUS(stoker_options_set(o, "transform", recipe), STOKER_OK);
    CHECK_STATUS(stoker_options_set(o, "batch_size", "2"), STOKER_OK);
    CHECK_STATUS(stoker_options_set(o, "num_workers", run == 0 ? "1" : "3"), STOKER_OK);
    CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
    stoker_options_free(o);
    CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
    CHECK_STATUS(stoker_batch_field(b, 0, &image), STOKER_OK);
    CHECK(image.dtype == STOKER_DTYPE_F32 && image.shape[2] == 32 && image.shape[3] == 32);
    const float *aug = image.data;
    if (run == 0) {
      memcpy(first, aug, sizeof first);
      size_t zeros = 0;
      for (size_t i = 0; i < 2 * 3 * 32 * 32; i++) zeros += aug[i] == 0.0f;
      CHECK(zeros >= 2 * 3 * 16); /* each image has an erased box of at least 2% of its area */
    } else {
      CHECK(memcmp(first, aug, sizeof first) == 0);
    }
    stoker_batch_release(b);
    stoker_loader_free(l);
  }
  o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "transform", "center_crop(32) | rand_augment(magnitude=40)"),
               STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("rand_augment");
  CHECK_ERROR_HAS("magnitude");
  stoker_options_free(o);

  /* stoker_transform_apply: one image through a spec, with the drawn parameters. */
  unsigned char rgb[4 * 6 * 3], flipped[4 * 6 * 3];
  for (int i = 0; i < 4 * 6 * 3; i++) rgb[i] = (unsigned char)(i * 7);
  char params[256];
  size_t needed = 0;
  CHECK_STATUS(stoker_transform_apply("center_crop(4, 6) | vflip(p=1)", rgb, 6, 4, 1, 0, 0, flipped,
                                      sizeof flipped, params, sizeof params, &needed),
               STOKER_OK);
  CHECK(memcmp(flipped, rgb + 3 * 18, 18) == 0 && memcmp(flipped + 3 * 18, rgb, 18) == 0);
  CHECK(needed > 0 && strstr(params, "\"op\":\"vflip\"") != NULL);
  CHECK_STATUS(stoker_transform_apply("center_crop(4, 6) | vflip(p=1)", rgb, 6, 4, 1, 0, 0, flipped,
                                      sizeof flipped - 1, NULL, 0, NULL),
               STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("out_len");

  remove_folder(&good);
  remove_folder(&bad);
  return t_finish("test_images");
}
