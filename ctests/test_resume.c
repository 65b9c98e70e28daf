/* stoker_loader_save_state: the buffer protocol, and resuming mid-epoch reproduces the batches. */
#include "testutil.h"

#define ROWS 11

/* The rows of the next `count` batches (or fewer at the end of the epoch); returns the number
 * of rows, with -1 separating batches. */
static int take(stoker_loader *l, int count, int64_t *out) {
  int n = 0;
  for (int i = 0; i < count; i++) {
    stoker_batch *b = NULL;
    stoker_status s = stoker_loader_next(l, &b);
    if (s == STOKER_END_OF_EPOCH) break;
    CHECK_STATUS(s, STOKER_OK);
    if (s != STOKER_OK) break;
    n += t_batch_rows(b, out + n);
    out[n++] = -1;
    stoker_batch_release(b);
  }
  return n;
}

/* The state of l, malloc'd. */
static char *save(stoker_loader *l) {
  size_t needed = 0;
  CHECK_STATUS(stoker_loader_save_state(l, NULL, 0, &needed), STOKER_OK);
  char *buf = malloc(needed);
  size_t again = 0;
  CHECK_STATUS(stoker_loader_save_state(l, buf, needed, &again), STOKER_OK);
  CHECK(again == needed && strlen(buf) + 1 == needed);
  return buf;
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600];
  t_write_dataset(&tmp, ROWS, source, NULL, sizeof source);

  stoker_loader *l = t_loader(source, NULL, "batch_size", "2", "shuffle", "true", "seed", "3",
                              "num_workers", "2", NULL);
  int64_t first[64];
  take(l, 2, first);

  /* The buffer protocol. */
  size_t needed = 0;
  CHECK_STATUS(stoker_loader_save_state(l, NULL, 0, &needed), STOKER_OK);
  CHECK(needed > 1);
  char buf[512];
  memset(buf, '#', sizeof buf);
  size_t needed2 = 0;
  CHECK_STATUS(stoker_loader_save_state(l, buf, needed - 1, &needed2), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("too short");
  CHECK(needed2 == needed);
  for (size_t i = 0; i < sizeof buf; i++) CHECK(buf[i] == '#'); /* nothing written */
  CHECK_STATUS(stoker_loader_save_state(l, buf, sizeof buf, &needed2), STOKER_OK);
  CHECK(strlen(buf) + 1 == needed && buf[needed] == '#');
  CHECK(strstr(buf, "stoker-state-v2") == buf);

  /* Resume mid-epoch: the rest of the epoch and the next one are the same batches. */
  char *state = save(l);
  int64_t rest[128], resumed[128];
  int n = take(l, 100, rest);
  n += take(l, 100, rest + n);
  stoker_loader_free(l);
  l = t_loader(source, NULL, "batch_size", "2", "shuffle", "true", "seed", "3", "num_workers",
               "1", "resume_state", state, NULL);
  CHECK(stoker_loader_epoch(l) == 0);
  int m = take(l, 100, resumed);
  m += take(l, 100, resumed + m);
  CHECK(n == m && n > 0);
  CHECK(memcmp(rest, resumed, sizeof(int64_t) * (size_t)n) == 0);
  CHECK(stoker_loader_epoch(l) == 2);
  free(state);

  /* Resuming at an epoch boundary starts the next epoch. */
  state = save(l);
  int64_t e2[64], e2_resumed[64];
  n = take(l, 100, e2);
  stoker_loader_free(l);
  l = t_loader(source, NULL, "batch_size", "2", "shuffle", "true", "seed", "3", "resume_state",
               state, NULL);
  CHECK(stoker_loader_epoch(l) == 2);
  m = take(l, 100, e2_resumed);
  CHECK(n == m && memcmp(e2, e2_resumed, sizeof(int64_t) * (size_t)n) == 0);
  stoker_loader_free(l);

  /* A state from another configuration is refused when the loader is made. */
  stoker_options *o = t_options(source, NULL, "batch_size", "5", "resume_state", state, NULL);
  stoker_loader *bad = (stoker_loader *)&bad;
  CHECK_STATUS(stoker_loader_new(o, &bad), STOKER_ERR_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  CHECK_ERROR_HAS("resume_state");
  stoker_options_free(o);
  free(state);

  t_tmp_cleanup(&tmp);
  return t_finish("test_resume");
}
