/* Reads the shards served by ctests/remote/run.sh through the C ABI: every sample once per
 * epoch for each shard pattern given on the command line (http:// from nginx, s3:// from an
 * S3 server), indexed and streaming, sharing the cache directory given first.
 * Usage: read_shards CACHE_DIR SAMPLES PATTERN... */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoker.h"

static void fail(const char *what) {
  char msg[1024];
  stoker_last_error(msg, sizeof msg);
  fprintf(stderr, "read_shards: %s: %s\n", what, msg);
  exit(1);
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: read_shards CACHE_DIR SAMPLES PATTERN...\n");
    return 2;
  }
  long samples = strtol(argv[2], NULL, 10);
  if (samples <= 0 || samples > 100000) return 2;
  char *seen = calloc((size_t)samples, 1);
  if (!seen) return 2;
  for (int p = 3; p < argc; p++) {
    for (int mode = 0; mode < 2; mode++) {
      char source[1024];
      snprintf(source, sizeof source, "tar:%s", argv[p]);
      stoker_options *o = stoker_options_new();
      if (!o) fail("options");
      if (stoker_options_set(o, "source", source) != STOKER_OK ||
          stoker_options_set(o, "fields", "cls:label") != STOKER_OK ||
          stoker_options_set(o, "batch_size", "3") != STOKER_OK ||
          stoker_options_set(o, "shuffle_buffer", mode ? "8" : "0") != STOKER_OK ||
          stoker_options_set(o, "shard_prefetch", "2") != STOKER_OK ||
          stoker_options_set(o, "cache_dir", argv[1]) != STOKER_OK)
        fail("options_set");
      stoker_loader *l = NULL;
      if (stoker_loader_new(o, &l) != STOKER_OK) fail(source);
      stoker_options_free(o);
      for (int epoch = 0; epoch < 2; epoch++) {
        memset(seen, 0, (size_t)samples);
        long count = 0;
        for (;;) {
          stoker_batch *b = NULL;
          enum stoker_status s = stoker_loader_next(l, &b);
          if (s == STOKER_END_OF_EPOCH) break;
          if (s != STOKER_OK) fail("next");
          stoker_tensor t;
          if (stoker_batch_field_by_name(b, "label", &t) != STOKER_OK) fail("label");
          const int64_t *v = t.data;
          for (int64_t i = 0; i < t.shape[0]; i++) {
            if (v[i] < 0 || v[i] >= samples || seen[v[i]]) {
              fprintf(stderr, "read_shards: %s: label %lld out of range or repeated\n", argv[p],
                      (long long)v[i]);
              return 1;
            }
            seen[v[i]] = 1;
            count++;
          }
          stoker_batch_release(b);
        }
        if (count != samples) {
          fprintf(stderr, "read_shards: %s: %ld samples, want %ld\n", argv[p], count, samples);
          return 1;
        }
      }
      stoker_loader_free(l);
    }
    printf("c: %s: %ld samples per epoch, both modes\n", argv[p], samples);
  }
  free(seen);
  return 0;
}
