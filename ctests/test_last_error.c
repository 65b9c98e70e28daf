/* stoker_last_error: buffer semantics, per-thread messages. */
#include <pthread.h>

#include "testutil.h"

static void *other_thread(void *arg) {
  (void)arg;
  /* Another thread's error is not this thread's. */
  size_t before = stoker_last_error(NULL, 0);
  stoker_options *o = stoker_options_new();
  stoker_status s = stoker_options_set(o, "seed", "minus one");
  stoker_options_free(o);
  char buf[256];
  stoker_last_error(buf, sizeof buf);
  return (void *)(intptr_t)(before == 0 && s == STOKER_ERR_INVALID_ARGUMENT &&
                            strstr(buf, "`seed`") != NULL);
}

int main(void) {
  /* No error yet. */
  char buf[512];
  memset(buf, 'x', sizeof buf);
  CHECK(stoker_last_error(NULL, 0) == 0);
  CHECK(stoker_last_error(buf, sizeof buf) == 0);
  CHECK(buf[0] == '\0');

  stoker_options *o = stoker_options_new();
  CHECK_STATUS(stoker_options_set(o, "batch_size", "0"), STOKER_ERR_INVALID_ARGUMENT);

  /* The full length, whatever the buffer. */
  size_t n = stoker_last_error(NULL, 0);
  CHECK(n > 20);
  memset(buf, 'x', sizeof buf);
  CHECK(stoker_last_error(buf, sizeof buf) == n);
  CHECK(strlen(buf) == n);
  CHECK(strstr(buf, "`batch_size`") != NULL);
  CHECK(strstr(buf, "out of range") != NULL);

  /* A short buffer gets len-1 bytes and a NUL, and nothing past it. */
  char small[8];
  memset(small, 'x', sizeof small);
  CHECK(stoker_last_error(small, 5) == n);
  CHECK(memcmp(small, buf, 4) == 0 && small[4] == '\0' && small[5] == 'x');
  /* len 1: just the NUL. */
  memset(small, 'x', sizeof small);
  CHECK(stoker_last_error(small, 1) == n);
  CHECK(small[0] == '\0' && small[1] == 'x');
  /* len 0 writes nothing, even with a buffer. */
  memset(small, 'x', sizeof small);
  CHECK(stoker_last_error(small, 0) == n);
  CHECK(small[0] == 'x');
  /* NULL buffer with a length: a query, no crash. */
  CHECK(stoker_last_error(NULL, 100) == n);

  /* A successful call does not clear the message of the last failed one. */
  CHECK_STATUS(stoker_options_set(o, "batch_size", "8"), STOKER_OK);
  CHECK(stoker_last_error(NULL, 0) == n);

  /* A new failure replaces it. */
  CHECK_STATUS(stoker_options_set(o, "shuffle", "maybe"), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("`shuffle`");
  CHECK_ERROR_HAS("not a boolean");
  stoker_options_free(o);

  /* Per thread. */
  pthread_t th;
  void *ok = NULL;
  CHECK(pthread_create(&th, NULL, other_thread, NULL) == 0);
  CHECK(pthread_join(th, &ok) == 0);
  CHECK(ok == (void *)1);
  CHECK_ERROR_HAS("`shuffle`"); /* this thread's message is untouched */
  return t_finish("test_last_error");
}
