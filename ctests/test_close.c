/* Closing a loader from another thread: a stoker_loader_next stalled on a slow source returns
 * STOKER_ERR_CLOSED as soon as another thread calls stoker_loader_close, every later call does
 * too, and stoker_loader_free (on the driving thread) still joins everything. */
#include <pthread.h>
#include <time.h>

#include "testutil.h"

/* A source whose read of sample 1 blocks until the test opens the gate. */
typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int open;
} gate;

static uint64_t g_len(void *user) {
  (void)user;
  return 16;
}

static int32_t g_read(void *user, uint64_t index, stoker_sample *s) {
  gate *g = user;
  if (index == 1) {
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
  }
  return stoker_sample_put_label(s, (int64_t)index) == STOKER_OK ? 0 : 1;
}

static void g_open(gate *g) {
  pthread_mutex_lock(&g->mu);
  g->open = 1;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

typedef struct {
  stoker_loader *l;
  stoker_status status;
} closer_args;

static void *close_later(void *arg) {
  closer_args *a = arg;
  struct timespec pause = {0, 100 * 1000 * 1000};
  nanosleep(&pause, NULL);
  a->status = stoker_loader_close(a->l);
  return NULL;
}

int main(void) {
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  stoker_source_callbacks cb = {&g, g_len, g_read, NULL};
  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set_source_callbacks(o, &cb), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "batch_size", "2"), STOKER_OK);
  CHECK_STATUS(stoker_options_set(o, "num_workers", "2"), STOKER_OK);
  stoker_loader *l = NULL;
  CHECK_STATUS(stoker_loader_new(o, &l), STOKER_OK);
  stoker_options_free(o);
  if (!l) return t_finish("test_close");

  /* Batch 0 holds sample 1, which stalls: next waits until the other thread closes. */
  closer_args args = {l, STOKER_ERR_INTERNAL};
  pthread_t t;
  double start = now_s();
  CHECK(pthread_create(&t, NULL, close_later, &args) == 0);
  stoker_batch *b = (stoker_batch *)1;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_ERR_CLOSED);
  CHECK(b == NULL);
  CHECK_ERROR_HAS("closed");
  double waited = now_s() - start;
  CHECK(pthread_join(t, NULL) == 0);
  CHECK_STATUS(args.status, STOKER_OK);
  /* Woken by the close, not by the source, which is still stalled. */
  CHECK(waited < 5.0);

  /* Every later call says closed; closing again is closing once; the calls that read the
   * loader still answer, so a watchdog can checkpoint where it stood. */
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_ERR_CLOSED);
  CHECK_STATUS(stoker_loader_set_epoch(l, 2), STOKER_ERR_CLOSED);
  CHECK_STATUS(stoker_loader_close(l), STOKER_OK);
  stoker_stats stats = {.size = sizeof stats};
  CHECK_STATUS(stoker_loader_stats(l, &stats), STOKER_OK);
  char state[512];
  size_t needed = 0;
  CHECK_STATUS(stoker_loader_save_state(l, state, sizeof state, &needed), STOKER_OK);
  CHECK(strncmp(state, "stoker-state-v2;", 16) == 0);
  uint64_t busy[8];
  size_t workers = 0;
  CHECK_STATUS(stoker_loader_worker_busy_ns(l, busy, 8, &workers), STOKER_OK);

  /* Free joins the workers once the stalled read returns. */
  g_open(&g);
  stoker_loader_free(l);

  return t_finish("test_close");
}
