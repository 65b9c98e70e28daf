/* Helpers shared by the C tests: checks that keep going and count failures, a temporary
 * directory, and a .npy writer (the header bytes written by hand, as NumPy's format spec says). */
#ifndef STOKER_TESTUTIL_H
#define STOKER_TESTUTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoker.h"

static int t_failures = 0;

/* The last error of this thread, in a static buffer. */
static inline const char *t_last_error(void) {
  static char buf[2048];
  buf[0] = '\0';
  stoker_last_error(buf, sizeof buf);
  return buf;
}

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
      t_failures++;                                                                  \
    }                                                                                \
  } while (0)

/* Checks that `call` returns `want`; on a mismatch prints both and the last error. */
#define CHECK_STATUS(call, want)                                                     \
  do {                                                                               \
    stoker_status got_ = (call);                                                     \
    if (got_ != (want)) {                                                            \
      fprintf(stderr, "%s:%d: %s returned %d, expected %s (%d); last error: %s\n",   \
              __FILE__, __LINE__, #call, (int)got_, #want, (int)(want),              \
              t_last_error());                                                       \
      t_failures++;                                                                  \
    }                                                                                \
  } while (0)

/* Checks that the last error on this thread contains `needle`. */
#define CHECK_ERROR_HAS(needle)                                                      \
  do {                                                                               \
    const char *msg_ = t_last_error();                                               \
    if (strstr(msg_, (needle)) == NULL) {                                            \
      fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__, __LINE__, \
              msg_, (needle));                                                       \
      t_failures++;                                                                  \
    }                                                                                \
  } while (0)

/* Ends a test program: prints the verdict and gives main's return value. */
static inline int t_finish(const char *name) {
  if (t_failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, t_failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

/* A temporary directory whose files are removed by t_tmp_cleanup. */
typedef struct t_tmp {
  char dir[256];
  char files[16][512];
  int nfiles;
} t_tmp;

static inline void t_tmp_init(t_tmp *t) {
  const char *base = getenv("TMPDIR");
  snprintf(t->dir, sizeof t->dir, "%s/stoker-ctest-XXXXXX", base && *base ? base : "/tmp");
  t->nfiles = 0;
  if (mkdtemp(t->dir) == NULL) {
    perror("mkdtemp");
    exit(2);
  }
}

/* Path of `name` in the directory, remembered for cleanup. */
static inline const char *t_tmp_path(t_tmp *t, const char *name) {
  if (t->nfiles == 16) {
    fprintf(stderr, "t_tmp_path: too many files\n");
    exit(2);
  }
  char *p = t->files[t->nfiles++];
  size_t dl = strlen(t->dir), nl = strlen(name);
  if (dl + 1 + nl + 1 > sizeof t->files[0]) {
    fprintf(stderr, "t_tmp_path: path too long\n");
    exit(2);
  }
  memcpy(p, t->dir, dl);
  p[dl] = '/';
  memcpy(p + dl + 1, name, nl + 1);
  return p;
}

static inline void t_tmp_cleanup(t_tmp *t) {
  for (int i = 0; i < t->nfiles; i++) unlink(t->files[i]);
  rmdir(t->dir);
}

/* Writes a C-order .npy (format 1.0) with dtype `descr` (e.g. "|u1", "<i8") and `shape`. Only the
 * first `keep` bytes of the data are written when keep < nbytes (a truncated file). */
static inline void t_write_npy(const char *path, const char *descr, const int64_t *shape, int ndim,
                        const void *data, size_t nbytes, size_t keep) {
  char dims[256] = "";
  size_t used = 0;
  for (int i = 0; i < ndim; i++)
    used += (size_t)snprintf(dims + used, sizeof dims - used, "%lld,%s", (long long)shape[i],
                             i + 1 < ndim ? " " : "");
  if (ndim > 1) dims[used - 1] = '\0'; /* (a, b) rather than (a, b,) */
  char dict[512];
  int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                   descr, dims);
  /* Pad with spaces so that magic (6) + version (2) + length (2) + header ends on 64 bytes. */
  size_t total = 10 + (size_t)n + 1;
  size_t padded = (total + 63) / 64 * 64;
  while ((size_t)n < padded - 10 - 1) dict[n++] = ' ';
  dict[n++] = '\n';
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  const unsigned char magic[8] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  const unsigned char len[2] = {(unsigned char)(n & 0xff), (unsigned char)(n >> 8)};
  fwrite(magic, 1, sizeof magic, f);
  fwrite(len, 1, sizeof len, f);
  fwrite(dict, 1, (size_t)n, f);
  fwrite(data, 1, keep < nbytes ? keep : nbytes, f);
  fclose(f);
}

/* The standard test data: `rows` samples of uint8 [2, 3], element (r, j) = r * 7 + j (mod 256),
 * and int64 labels 10 * r. Writes "data.npy" and "labels.npy" into t and returns their paths in
 * "npy:PATH" form. */
#define T_ROW 6
static inline uint8_t t_value(int64_t row, int j) { return (uint8_t)((row * 7 + j) & 0xff); }

static inline void t_write_dataset(t_tmp *t, int64_t rows, char *data_source, char *labels_source,
                            size_t cap) {
  uint8_t *data = malloc((size_t)rows * T_ROW);
  int64_t *labels = malloc((size_t)rows * sizeof(int64_t));
  for (int64_t r = 0; r < rows; r++) {
    for (int j = 0; j < T_ROW; j++) data[r * T_ROW + j] = t_value(r, j);
    labels[r] = 10 * r;
  }
  const char *dp = t_tmp_path(t, "data.npy");
  const char *lp = t_tmp_path(t, "labels.npy");
  int64_t shape[3] = {rows, 2, 3};
  t_write_npy(dp, "|u1", shape, 3, data, (size_t)rows * T_ROW, (size_t)-1);
  t_write_npy(lp, "<i8", shape, 1, labels, (size_t)rows * sizeof(int64_t), (size_t)-1);
  snprintf(data_source, cap, "npy:%s", dp);
  if (labels_source) snprintf(labels_source, cap, "npy:%s", lp);
  free(data);
  free(labels);
}

/* Options for the standard dataset; any extra key/value pairs follow, ended by NULL. */
static inline stoker_options *t_options(const char *source, const char *labels, ...) {
  stoker_options *o = stoker_options_new();
  CHECK(o != NULL);
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  if (labels) CHECK_STATUS(stoker_options_set(o, "labels", labels), STOKER_OK);
  va_list ap;
  va_start(ap, labels);
  for (;;) {
    const char *k = va_arg(ap, const char *);
    if (!k) break;
    const char *v = va_arg(ap, const char *);
    CHECK_STATUS(stoker_options_set(o, k, v), STOKER_OK);
  }
  va_end(ap);
  return o;
}

/* A loader over the standard dataset; see t_options. */
#define t_loader(...) t_loader_from(t_options(__VA_ARGS__))
static inline stoker_loader *t_loader_from(stoker_options *o) {
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);
  if (!l) {
    fprintf(stderr, "cannot continue without a loader\n");
    exit(1);
  }
  return l;
}

/* The source row of every sample of field `data` in b, checked against t_value; returns the
 * number of samples and writes their rows to rows_out. */
static inline int t_batch_rows(const stoker_batch *b, int64_t *rows_out) {
  stoker_tensor t;
  CHECK_STATUS(stoker_batch_field_by_name(b, "data", &t), STOKER_OK);
  const uint8_t *p = (const uint8_t *)t.data;
  for (int64_t i = 0; i < t.shape[0]; i++) {
    /* Row r starts with r * 7 mod 256; rows < 256/7 are unambiguous in the tests. */
    int64_t r = p[i * T_ROW] / 7;
    for (int j = 0; j < T_ROW; j++) CHECK(p[i * T_ROW + j] == t_value(r, j));
    rows_out[i] = r;
  }
  return (int)t.shape[0];
}

#endif
