/* WebDataset tar shards (source=tar:PATTERN): indexed mode (shuffle_buffer=0) and streaming mode
 * (shuffle_buffer=N) over uneven shards written here as plain ustar files. Every sample once per
 * epoch across two ranks with equal batch counts, the same batches whatever num_workers, raw
 * bytes padded with their lengths, mid-epoch resume, and a truncated shard: an error naming the
 * shard and the byte offset, or (on_error=skip) its readable part kept and counted. */
#include "testutil.h"

#define MAX_IDS 64

/* Appends one ustar member to f. */
static void tar_member(FILE *f, const char *name, const void *data, size_t size) {
  unsigned char h[512];
  memset(h, 0, sizeof h);
  snprintf((char *)h, 100, "%s", name);
  memcpy(h + 100, "0000644", 8);
  memcpy(h + 108, "0000000", 8);
  memcpy(h + 116, "0000000", 8);
  snprintf((char *)h + 124, 12, "%011o", (unsigned)size);
  memcpy(h + 136, "00000000000", 12);
  h[156] = '0';
  memcpy(h + 257, "ustar", 6);
  memcpy(h + 263, "00", 2);
  memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; i++) sum += h[i];
  snprintf((char *)h + 148, 8, "%06o", sum);
  h[155] = ' ';
  fwrite(h, 1, sizeof h, f);
  fwrite(data, 1, size, f);
  static const unsigned char zeros[512];
  fwrite(zeros, 1, (512 - size % 512) % 512, f);
}

/* A shard of samples first..first+n-1: k%06d.cls (the id as text) and k%06d.txt (1 + id % 4
 * bytes of 'a' + id % 26). */
static void write_shard(const char *path, int first, int n) {
  FILE *f = fopen(path, "wb");
  if (!f) {
    perror(path);
    exit(2);
  }
  for (int id = first; id < first + n; id++) {
    char name[32], text[16], txt[8];
    snprintf(name, sizeof name, "k%06d.cls", id);
    int len = snprintf(text, sizeof text, "%d", id);
    tar_member(f, name, text, (size_t)len);
    snprintf(name, sizeof name, "k%06d.txt", id);
    memset(txt, 'a' + id % 26, sizeof txt);
    tar_member(f, name, txt, (size_t)(1 + id % 4));
  }
  static const unsigned char end[1024];
  fwrite(end, 1, sizeof end, f);
  fclose(f);
}

static stoker_loader *tar_loader(const char *pattern, const char *const *kv) {
  char source[600];
  snprintf(source, sizeof source, "tar:%s", pattern);
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "source", source), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "fields", "cls:label,txt:caption"), STOKER_OK);
  for (; kv && kv[0]; kv += 2) CHECK_STATUS(stoker_options_set(o, kv[0], kv[1]), STOKER_OK);
  stoker_loader *l = NULL;
  stoker_status st = stoker_loader_new(o, &l);
  stoker_options_free(o);
  return st == STOKER_OK ? l : NULL;
}

/* The ids of the rest of the epoch; checks each caption row against its id. */
static int epoch_ids(stoker_loader *l, int64_t *ids, int max, int *batches) {
  int n = 0;
  *batches = 0;
  stoker_batch *b;
  stoker_status st;
  while ((st = stoker_loader_next(l, &b)) == STOKER_OK) {
    stoker_tensor lab, cap, len;
    CHECK_STATUS(stoker_batch_field_by_name(b, "label", &lab), STOKER_OK);
    CHECK_STATUS(stoker_batch_field_by_name(b, "caption", &cap), STOKER_OK);
    CHECK_STATUS(stoker_batch_field_by_name(b, "caption_lengths", &len), STOKER_OK);
    CHECK(cap.dtype == STOKER_DTYPE_U8 && cap.ndim == 2);
    for (int64_t r = 0; r < lab.shape[0]; r++) {
      int64_t id = ((int64_t *)lab.data)[r];
      int64_t length = ((int64_t *)len.data)[r];
      CHECK(length == 1 + id % 4);
      const uint8_t *row = (const uint8_t *)cap.data + r * cap.shape[1];
      for (int64_t k = 0; k < cap.shape[1]; k++)
        CHECK(row[k] == (k < length ? (uint8_t)('a' + id % 26) : 0));
      if (n < max) ids[n++] = id;
    }
    (*batches)++;
    stoker_batch_release(b);
  }
  CHECK_STATUS(st, STOKER_END_OF_EPOCH);
  return n;
}

static int count_of(const int64_t *ids, int n, int64_t id) {
  int c = 0;
  for (int i = 0; i < n; i++) c += ids[i] == id;
  return c;
}

int main(void) {
  t_tmp t;
  t_tmp_init(&t);
  /* 11 + 2 + 8 = 21 samples. */
  const int sizes[3] = {11, 2, 8};
  for (int s = 0, first = 0; s < 3; first += sizes[s], s++) {
    char name[32];
    snprintf(name, sizeof name, "shard-%d.tar", s);
    write_shard(t_tmp_path(&t, name), first, sizes[s]);
  }
  /* Index files are written beside the shards: remember them for cleanup. */
  for (int s = 0; s < 3; s++) {
    char name[32];
    snprintf(name, sizeof name, ".shard-%d.tar.idx", s);
    t_tmp_path(&t, name);
  }
  char pattern[512];
  snprintf(pattern, sizeof pattern, "%s/shard-{0..2}.tar", t.dir);
  int64_t ids[2][MAX_IDS], other[MAX_IDS];

  for (int mode = 0; mode < 2; mode++) {
    const char *buffer = mode ? "6" : "0";
    int n[2], batches[2];
    for (int rank = 0; rank < 2; rank++) {
      char r[4];
      snprintf(r, sizeof r, "%d", rank);
      const char *kv[] = {"batch_size", "4", "shuffle", "true", "seed", "3", "shuffle_buffer",
                          buffer, "world_size", "2", "rank", r, "num_workers", "2", NULL};
      stoker_loader *l = tar_loader(pattern, kv);
      CHECK(l != NULL);
      if (!l) return t_finish("test_tar");
      CHECK(stoker_loader_batches_per_epoch(l) == 3); /* ceil(21 / 2) = 11 samples */
      n[rank] = epoch_ids(l, ids[rank], MAX_IDS, &batches[rank]);
      stoker_loader_free(l);
    }
    CHECK(n[0] == 11 && n[1] == 11 && batches[0] == 3 && batches[1] == 3);
    int extra = 0;
    for (int64_t id = 0; id < 21; id++) {
      int c = count_of(ids[0], n[0], id) + count_of(ids[1], n[1], id);
      CHECK(c >= 1);
      extra += c - 1;
    }
    CHECK(extra == 1); /* 22 deliveries of 21 samples: one padding repeat */

    /* The same batches with the work in the calling thread. */
    const char *kv0[] = {"batch_size", "4", "shuffle", "true", "seed", "3", "shuffle_buffer",
                         buffer, "world_size", "2", "rank", "1", "num_workers", "0", NULL};
    stoker_loader *l0 = tar_loader(pattern, kv0);
    int b0;
    CHECK(epoch_ids(l0, other, MAX_IDS, &b0) == 11);
    CHECK(memcmp(other, ids[1], sizeof(int64_t) * 11) == 0);
    stoker_loader_free(l0);

    /* Resume after two batches. */
    const char *kv1[] = {"batch_size", "4", "shuffle", "true", "seed", "3", "shuffle_buffer",
                         buffer, "num_workers", "2", NULL};
    stoker_loader *l1 = tar_loader(pattern, kv1);
    int whole = epoch_ids(l1, other, MAX_IDS, &b0);
    CHECK(whole == 21);
    stoker_loader_free(l1);
    l1 = tar_loader(pattern, kv1);
    stoker_batch *b;
    for (int i = 0; i < 2; i++) {
      CHECK_STATUS(stoker_loader_next(l1, &b), STOKER_OK);
      stoker_batch_release(b);
    }
    char state[512];
    size_t needed;
    CHECK_STATUS(stoker_loader_save_state(l1, state, sizeof state, &needed), STOKER_OK);
    stoker_loader_free(l1);
    const char *kvr[] = {"batch_size", "4", "shuffle", "true", "seed", "3", "shuffle_buffer",
                         buffer, "num_workers", "2", "resume_state", state, NULL};
    stoker_loader *lr = tar_loader(pattern, kvr);
    int64_t rest[MAX_IDS];
    CHECK(epoch_ids(lr, rest, MAX_IDS, &b0) == 13);
    CHECK(memcmp(rest, other + 8, sizeof(int64_t) * 13) == 0);
    stoker_loader_free(lr);
  }

  /* A truncated shard: cut inside the header of k000015.txt (the third sample of shard-2). */
  const char *damaged = t.files[2];
  FILE *f = fopen(damaged, "rb+");
  CHECK(f != NULL);
  /* Each sample of shard-2 takes 4 blocks (cls header + data, txt header + data). */
  CHECK(ftruncate(fileno(f), 2 * 2048 + 512 + 512 + 1) == 0);
  fclose(f);
  for (int mode = 0; mode < 2; mode++) {
    const char *buffer = mode ? "6" : "0";
    const char *kv[] = {"batch_size", "4", "shuffle_buffer", buffer, NULL};
    CHECK(tar_loader(pattern, kv) == NULL);
    CHECK_ERROR_HAS("shard-2.tar");
    CHECK_ERROR_HAS("byte offset");
    const char *kvs[] = {"batch_size", "4", "shuffle_buffer", buffer, "on_error", "skip", NULL};
    stoker_loader *l = tar_loader(pattern, kvs);
    CHECK(l != NULL);
    if (!l) continue;
    int nb;
    int n = epoch_ids(l, other, MAX_IDS, &nb);
    CHECK(n >= 13 && n < 21);
    for (int64_t id = 0; id < 13; id++) CHECK(count_of(other, n, id) == 1);
    stoker_stats stats;
    memset(&stats, 0, sizeof stats);
    stats.size = sizeof stats;
    CHECK_STATUS(stoker_loader_stats(l, &stats), STOKER_OK);
    CHECK(stats.samples_skipped == 1);
    stoker_loader_free(l);
  }

  /* Options that need the other mode. */
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "fields", "jpg"), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("EXT:NAME");
  CHECK_STATUS(stoker_options_set(o, "shuffle_buffer", "-1"), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_options_set(o, "source", "tar:"), STOKER_ERR_INVALID_ARGUMENT);
  stoker_options_free(o);

  t_tmp_cleanup(&t);
  return t_finish("test_tar");
}
