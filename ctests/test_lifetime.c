/* Lifetimes and threads: batches outlive their loader, a loader freed mid-epoch joins its
 * threads, batches are released from other threads, stats are read while another thread drives
 * the loader. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "testutil.h"

#define ROWS 12

static void check_rows(stoker_batch *b, int64_t first, int count) {
  int64_t rows[64];
  CHECK(t_batch_rows(b, rows) == count);
  for (int i = 0; i < count; i++) CHECK(rows[i] == first + i);
}

static void *release_batch(void *b) {
  check_rows((stoker_batch *)b, 4, 2); /* read it here first */
  stoker_batch_release((stoker_batch *)b);
  return NULL;
}

struct poller {
  stoker_loader *l;
  atomic_int stop, polls;
  int bad;
};

static void *poll_stats(void *arg) {
  struct poller *p = arg;
  uint64_t last = 0;
  while (!atomic_load(&p->stop)) {
    stoker_stats s;
    s.size = sizeof s;
    if (stoker_loader_stats(p->l, &s) != STOKER_OK || s.batches < last) p->bad++;
    last = s.batches;
    atomic_fetch_add(&p->polls, 1);
  }
  return NULL;
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600], labels[600];
  t_write_dataset(&tmp, ROWS, source, labels, sizeof source);

  /* A loader freed mid-epoch while two batches (and prefetched ones) are outstanding. */
  stoker_loader *l = t_loader(source, labels, "batch_size", "2", "num_workers", "2",
                              "prefetch_factor", "3", NULL);
  stoker_batch *b0 = NULL, *b1 = NULL, *b2 = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b0), STOKER_OK);
  CHECK_STATUS(stoker_loader_next(l, &b1), STOKER_OK);
  CHECK_STATUS(stoker_loader_next(l, &b2), STOKER_OK);
  stoker_loader_free(l); /* joins the workers; the batches stay valid */
  check_rows(b0, 0, 2);
  check_rows(b1, 2, 2);
  stoker_tensor t;
  CHECK_STATUS(stoker_batch_field_by_name(b0, "label", &t), STOKER_OK);
  CHECK(((const int64_t *)t.data)[1] == 10);
  /* Release one here, one on another thread, one last. */
  stoker_batch_release(b0);
  pthread_t th;
  CHECK(pthread_create(&th, NULL, release_batch, b2) == 0);
  CHECK(pthread_join(th, NULL) == 0);
  check_rows(b1, 2, 2);
  stoker_batch_release(b1);

  /* A loader freed right after creation, and one freed at an epoch boundary. */
  l = t_loader(source, NULL, "num_workers", "3", NULL);
  stoker_loader_free(l);
  l = t_loader(source, NULL, "batch_size", "12", NULL);
  stoker_batch *b = NULL;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_OK);
  stoker_batch_release(b);
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_END_OF_EPOCH);
  CHECK(b == NULL);
  stoker_loader_free(l);

  /* Stats from another thread while this one drives the loader for a few epochs. */
  struct poller p;
  p.l = t_loader(source, NULL, "batch_size", "1", "num_workers", "2", NULL);
  atomic_init(&p.stop, 0);
  atomic_init(&p.polls, 0);
  p.bad = 0;
  CHECK(pthread_create(&th, NULL, poll_stats, &p) == 0);
  while (atomic_load(&p.polls) == 0) sched_yield(); /* overlap for sure */
  int delivered = 0;
  for (int epoch = 0; epoch < 3; epoch++) {
    for (;;) {
      stoker_status s = stoker_loader_next(p.l, &b);
      if (s != STOKER_OK) {
        CHECK_STATUS(s, STOKER_END_OF_EPOCH);
        break;
      }
      delivered++;
      stoker_batch_release(b);
    }
  }
  atomic_store(&p.stop, 1);
  CHECK(pthread_join(th, NULL) == 0);
  CHECK(delivered == 3 * ROWS);
  CHECK(p.bad == 0);
  CHECK(atomic_load(&p.polls) > 0);
  stoker_stats s;
  s.size = sizeof s;
  CHECK_STATUS(stoker_loader_stats(p.l, &s), STOKER_OK);
  CHECK(s.batches == 3 * ROWS);
  stoker_loader_free(p.l);

  t_tmp_cleanup(&tmp);
  return t_finish("test_lifetime");
}
