/* stoker's packed format through the C API: stoker_pack writes real photographs (kept as JPEG,
 * or as raw pixels) and source=packed:PATH reads them into the same batches as the image folder
 * they came from; two slices packed separately and joined by stoker_pack_merge read the same;
 * bad arguments and a missing dataset fail with a status and a message naming them.
 *   test_packed FIXTURE_DIR   (crates/stoker-core/tests/data/images) */
#include <sys/stat.h>

#include "testutil.h"

#define PIXELS (4 * 3 * 32 * 32)

static void copy_file(const char *from, const char *to) {
  static unsigned char buf[400000];
  FILE *f = fopen(from, "rb");
  if (!f) {
    perror(from);
    exit(2);
  }
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  FILE *g = fopen(to, "wb");
  if (!g) {
    perror(to);
    exit(2);
  }
  fwrite(buf, 1, n, g);
  fclose(g);
}

/* The first batch (4 images, float32 [4, 3, 32, 32]) of `source`, copied into `out`. */
static void first_batch(const char *source, float *out) {
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "transform", "random_resized_crop(32) | hflip | normalize(imagenet)"),
               STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "batch_size", "4"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "shuffle", "true"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "seed", "11"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "num_workers", "2"), STOKER_OK);
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);
  memset(out, 0, sizeof(float) * PIXELS);
  if (l == NULL) return;
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  if (b != NULL) {
    stoker_tensor image;
    CHECK_STATUS(stoker_batch_field_by_name(b, "image", &image), STOKER_OK);
    CHECK(image.dtype == STOKER_DTYPE_F32 && image.ndim == 4 && image.shape[0] == 4);
    memcpy(out, image.data, sizeof(float) * PIXELS);
    stoker_batch_release(b);
  }
  stoker_loader_free(l);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s FIXTURE_DIR\n", argv[0]);
    return 2;
  }
  const char *names[4] = {"photo_baseline.jpg", "photo_progressive.jpg", "photo_444.jpg",
                          "photo_gray.jpg"};
  t_tmp t;
  t_tmp_init(&t);
  char dir[600];
  snprintf(dir, sizeof dir, "%s/images", t.dir);
  mkdir(dir, 0700);
  snprintf(dir, sizeof dir, "%s/images/class_a", t.dir);
  mkdir(dir, 0700);
  snprintf(dir, sizeof dir, "%s/sliced", t.dir);
  mkdir(dir, 0700);
  for (int i = 0; i < 4; i++) {
    char from[1024], name[64];
    snprintf(from, sizeof from, "%s/%s", argv[1], names[i]);
    snprintf(name, sizeof name, "images/class_a/%d.jpg", i);
    copy_file(from, t_tmp_path(&t, name));
  }
  char folder[600], kept[600], raw[600], sliced[600];
  snprintf(folder, sizeof folder, "image_folder:%s/images", t.dir);
  snprintf(kept, sizeof kept, "%s", t_tmp_path(&t, "kept.stkpack"));
  snprintf(raw, sizeof raw, "%s", t_tmp_path(&t, "raw.stkpack"));
  snprintf(sliced, sizeof sliced, "%s/sliced", t.dir);
  CHECK_STATUS(stoker_pack(folder, kept, 0, 90, "jpeg", 0, 0, 0), STOKER_OK);
  CHECK_STATUS(stoker_pack(folder, raw, 0, 90, "raw", 0, 0, 0), STOKER_OK);
  CHECK_STATUS(stoker_pack(folder, sliced, 0, 90, NULL, 0, 0, 2), STOKER_OK);
  CHECK_STATUS(stoker_pack(folder, sliced, 0, 90, NULL, 0, 1, 2), STOKER_OK);
  CHECK_STATUS(stoker_pack_merge(sliced), STOKER_OK);
  t_tmp_path(&t, "sliced/part-00000-of-00002-00000.stkpack");
  t_tmp_path(&t, "sliced/part-00001-of-00002-00000.stkpack");
  t_tmp_path(&t, "sliced/index.stkidx");

  static float want[PIXELS], got[PIXELS];
  first_batch(folder, want);
  char source[700];
  snprintf(source, sizeof source, "packed:%s", kept);
  first_batch(source, got);
  CHECK(memcmp(want, got, sizeof want) == 0);
  snprintf(source, sizeof source, "packed:%s", raw);
  first_batch(source, got);
  /* The raw pack holds whole decodes; the JPEGs are decoded for the crop (only its region,
   * shrunk in the DCT domain when the crop is 6x the output): the same crops and flips, pixels
   * within 1 level on average and 8 at most (levels of 1/255 over the smallest std, 0.225). */
  double sum = 0, worst = 0;
  for (int i = 0; i < PIXELS; i++) {
    double d = ((double)want[i] - (double)got[i]) * 0.225 * 255.0;
    d = d < 0 ? -d : d;
    sum += d;
    worst = d > worst ? d : worst;
  }
  CHECK(sum / PIXELS <= 1.0 && worst <= 8.5);
  snprintf(source, sizeof source, "packed:%s", sliced);
  first_batch(source, got);
  CHECK(memcmp(want, got, sizeof want) == 0);

  /* Bad arguments and a missing dataset. */
  CHECK_STATUS(stoker_pack(NULL, kept, 0, 90, NULL, 0, 0, 0), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("src");
  CHECK_STATUS(stoker_pack(folder, kept, 0, 90, "webp", 0, 0, 0), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("webp");
  CHECK_STATUS(stoker_pack(folder, kept, 0, 500, NULL, 0, 0, 0), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_pack(folder, sliced, 0, 90, NULL, 0, 3, 2), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_pack_merge(t.dir), STOKER_ERR_IO);
  stoker_options *o = stoker_options_new();
  snprintf(source, sizeof source, "packed:%s/missing.stkpack", t.dir);
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_ERR_IO);
  CHECK_ERROR_HAS("missing.stkpack");
  CHECK(l == NULL);
  stoker_options_free(o);

  t_tmp_cleanup(&t); /* the files; the directories go next, innermost first */
  rmdir(sliced);
  snprintf(dir, sizeof dir, "%s/images/class_a", t.dir);
  rmdir(dir);
  snprintf(dir, sizeof dir, "%s/images", t.dir);
  rmdir(dir);
  rmdir(t.dir);
  return t_finish("test_packed");
}
