/* fork() after making a loader (multiprocessing workers, pre-forking servers): in the child, every
 * call that needs the loader's threads (which exist in the parent only) fails with
 * STOKER_ERR_UNSUPPORTED saying so, never hangs; releasing a batch and freeing the loader there
 * return; a loader made in the child works; the parent's loader goes on unaffected.
 *
 * The child reports its failure count through a pipe, then ends with SIGKILL, so that no exit-time
 * leak check runs in it: it leaks the parent's loader on purpose (the threads that freeing it
 * would join exist in the parent only). LeakSanitizer and valgrind examine the parent (valgrind
 * runs this test with --child-silent-after-fork=yes, see CMakeLists.txt). A child that hangs is
 * ended by alarm(). */
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

#include "testutil.h"

enum { ROWS = 32, BATCH = 4, BATCHES = ROWS / BATCH, HANG_LIMIT_S = 90 };

#if defined(__SANITIZE_ADDRESS__)
#define FORK_WHEN_IDLE 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FORK_WHEN_IDLE 1
#endif
#endif

#ifdef FORK_WHEN_IDLE
/* Under AddressSanitizer the fork waits until the loader's workers are idle (no worker's busy
 * time moved in 50 ms; at most 5 s). GCC 12's libasan, as LLVM's before 17, does not lock its
 * allocator around fork(): a fork while another thread is inside malloc leaves the child's
 * first malloc blocked for good (one CI run in many). That is the sanitizer's limit, not the
 * library's: the plain and valgrind runs fork at once, workers busy or not. */
static void wait_until_workers_idle(stoker_loader *l) {
  uint64_t last[2] = {0, 0}, now[2] = {0, 0};
  size_t count = 0;
  struct timespec pause = {0, 50 * 1000 * 1000};
  for (int i = 0; i < 100; i++) {
    nanosleep(&pause, NULL);
    CHECK_STATUS(stoker_loader_worker_busy_ns(l, now, 2, &count), STOKER_OK);
    if (memcmp(now, last, sizeof now) == 0) return;
    memcpy(last, now, sizeof now);
  }
}
#endif

/* Batches left in the current epoch, each checked and released. */
static int drain(stoker_loader *l) {
  int n = 0;
  stoker_batch *b = NULL;
  stoker_status s;
  while ((s = stoker_loader_next(l, &b)) == STOKER_OK) {
    int64_t rows[BATCH];
    CHECK(t_batch_rows(b, rows) == BATCH);
    stoker_batch_release(b);
    n++;
  }
  CHECK_STATUS(s, STOKER_END_OF_EPOCH);
  return n;
}

/* What the child checks; returns its failure count. */
static int in_child(stoker_loader *l, stoker_batch *held, const char *data, const char *labels,
                    long parent) {
  char names_parent[64];
  snprintf(names_parent, sizeof names_parent, "created in process %ld before fork()", parent);

  stoker_batch *b = (stoker_batch *)1;
  CHECK_STATUS(stoker_loader_next(l, &b), STOKER_ERR_UNSUPPORTED);
  CHECK(b == NULL);
  CHECK_ERROR_HAS(names_parent);
  CHECK_ERROR_HAS("create a new loader after the fork");
  CHECK_STATUS(stoker_loader_set_epoch(l, 1), STOKER_ERR_UNSUPPORTED);
  CHECK_ERROR_HAS(names_parent);
  stoker_stats st;
  st.size = sizeof st;
  CHECK_STATUS(stoker_loader_stats(l, &st), STOKER_ERR_UNSUPPORTED);
  CHECK_ERROR_HAS(names_parent);
  size_t count = 0;
  CHECK_STATUS(stoker_loader_worker_busy_ns(l, NULL, 0, &count), STOKER_ERR_UNSUPPORTED);
  /* What the loader knows by itself still answers. */
  CHECK(stoker_loader_epoch(l) == 0);
  CHECK(stoker_loader_batches_per_epoch(l) == BATCHES);
  size_t needed = 0;
  CHECK_STATUS(stoker_loader_save_state(l, NULL, 0, &needed), STOKER_OK);
  CHECK(needed > 1);
  /* The batch held across the fork is readable, and releasing it returns. */
  int64_t rows[BATCH];
  CHECK(t_batch_rows(held, rows) == BATCH);
  stoker_batch_release(held);
  /* Closing and freeing return (the loader is leaked, not joined). */
  CHECK_STATUS(stoker_loader_close(l), STOKER_OK);
  stoker_loader_free(l);

  /* A loader made here is the child's own, and works. */
  stoker_loader *mine = t_loader(data, labels, "batch_size", "4", "num_workers", "2", NULL);
  CHECK(drain(mine) == BATCHES);
  CHECK(drain(mine) == BATCHES);
  CHECK_STATUS(stoker_loader_stats(mine, &st), STOKER_OK);
  CHECK(st.batches == 2 * BATCHES);
  stoker_loader_free(mine);
  return t_failures;
}

int main(void) {
  t_tmp t;
  t_tmp_init(&t);
  char data[600], labels[600];
  t_write_dataset(&t, ROWS, data, labels, sizeof data);
  stoker_loader *l = t_loader(data, labels, "batch_size", "4", "num_workers", "2", NULL);
  /* Held across the fork: released in the child, and separately in the parent. */
  stoker_batch *held = NULL;
  CHECK_STATUS(stoker_loader_next(l, &held), STOKER_OK);
  if (!held) return t_finish("test_fork");

  int report[2];
  CHECK(pipe(report) == 0);
#ifdef FORK_WHEN_IDLE
  wait_until_workers_idle(l);
#endif
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) {
    alarm(HANG_LIMIT_S);
    close(report[0]);
    int failures = in_child(l, held, data, labels, (long)getppid());
    ssize_t written = write(report[1], &failures, sizeof failures);
    (void)written; /* nothing written reads as a failed child */
    fflush(NULL);
    raise(SIGKILL);
  }
  close(report[1]);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  int child_failures = -1;
  ssize_t got = read(report[0], &child_failures, sizeof child_failures);
  close(report[0]);
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
    fprintf(stderr, "test_fork: the child hung (ended after %d s)\n", HANG_LIMIT_S);
    t_failures++;
  } else {
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK(got == (ssize_t)sizeof child_failures);
    CHECK(child_failures == 0);
  }

  /* The parent's loader goes on: the rest of the epoch, then a whole one. */
  stoker_batch_release(held);
  CHECK(drain(l) == BATCHES - 1);
  CHECK(drain(l) == BATCHES);
  stoker_stats st;
  st.size = sizeof st;
  CHECK_STATUS(stoker_loader_stats(l, &st), STOKER_OK);
  CHECK(st.batches == 2 * BATCHES);
  stoker_loader_free(l);
  t_tmp_cleanup(&t);
  return t_finish("test_fork");
}
