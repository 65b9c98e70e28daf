/* stoker_loader_stats: the caller-set size protocol (old and new callers) and the values. */
#include "testutil.h"

/* A caller built against a future header with two more fields. */
typedef struct newer_stats {
  stoker_stats known;
  uint64_t future_a, future_b;
} newer_stats;

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600];
  t_write_dataset(&tmp, 10, source, NULL, sizeof source);
  stoker_loader *l = t_loader(source, NULL, "batch_size", "4", "num_workers", "1", NULL);
  stoker_batch *b = NULL;
  int batches = 0;
  while (stoker_loader_next(l, &b) == STOKER_OK) {
    batches++;
    stoker_batch_release(b);
  }
  CHECK(batches == 3);

  /* The current size: every field. */
  stoker_stats s;
  memset(&s, 0xAB, sizeof s);
  s.size = sizeof s;
  CHECK_STATUS(stoker_loader_stats(l, &s), STOKER_OK);
  CHECK(s.size == sizeof s);
  CHECK(s.batches == 3 && s.samples == 10 && s.samples_skipped == 0);
  CHECK(s.wait_ns_max >= s.wait_ns_p95 && s.wait_ns_p95 >= s.wait_ns_p50);
  CHECK(s.wait_ns_total >= s.wait_ns_max);
  CHECK(s.elapsed_ns > 0 && s.elapsed_ns >= s.wait_ns_total);
  CHECK(s.readiness >= 0.0 && s.readiness <= 1.0);
  CHECK(s.worker_busy >= 0.0 && s.worker_busy <= 1.0);
  /* pin_memory is off by default: nothing pinned, nothing refused. */
  CHECK(s.slabs_pinned == 0 && s.pin_failures == 0);

  /* Stages: an npy source is read and collated, never decoded, transformed or copied to a
     device; the stages are part of the workers' busy time. */
  CHECK(s.read_ns > 0 && s.collate_ns > 0);
  CHECK(s.decode_ns == 0 && s.transform_ns == 0 && s.h2d_ns == 0);
  CHECK(s.read_ns + s.decode_ns + s.transform_ns + s.collate_ns <= s.busy_ns);
  CHECK(s.read_ns_p50 > 0 && s.read_ns_p50 <= s.read_ns_p95 && s.read_ns_p95 <= s.read_ns);
  CHECK(s.collate_ns_p50 > 0 && s.collate_ns_p50 <= s.collate_ns_p95);
  CHECK(s.decode_ns_p50 == 0 && s.transform_ns_p95 == 0 && s.h2d_ns_p50 == 0);
  CHECK(s.num_workers == 1);

  /* Per-worker busy time: the count alone, then the values (the worker may still be building
     batches of the next epoch, so its time only grows). */
  size_t count = 99;
  CHECK_STATUS(stoker_loader_worker_busy_ns(l, NULL, 0, &count), STOKER_OK);
  CHECK(count == 1);
  uint64_t busy[4] = {0, 0, 7, 7};
  CHECK_STATUS(stoker_loader_worker_busy_ns(l, busy, 4, &count), STOKER_OK);
  CHECK(count == 1 && busy[0] >= s.busy_ns && busy[1] == 0 && busy[2] == 7);
  CHECK_STATUS(stoker_loader_worker_busy_ns(l, NULL, 1, &count), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("out");
  CHECK_STATUS(stoker_loader_worker_busy_ns(l, busy, 4, NULL), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_STATUS(stoker_loader_worker_busy_ns(NULL, busy, 4, &count), STOKER_ERR_INVALID_ARGUMENT);

  /* The memory budget: the default fits these small batches, so the cap is what was asked for
     (1 worker x prefetch_factor 2). */
  CHECK(s.memory_budget > 0 && s.batch_bytes > 0 && s.batch_bytes <= s.memory_budget);
  CHECK(s.in_flight_cap == 2 && s.in_flight_cap_requested == 2);
  CHECK(s.prefetch_factor == 2 && s.autotune_decisions == 0);
  /* How far ahead it builds (1 worker + 1, within the cap) and the batch memory that holds:
     slabs were mapped for the three batches, and some are still mapped for reuse. */
  CHECK(s.in_flight_depth == 2);
  CHECK(s.batch_memory_bytes > 0 && s.batch_memory_peak_bytes >= s.batch_memory_bytes);
  CHECK(s.batch_memory_peak_bytes <= (s.in_flight_cap + 2) * s.batch_bytes);
  /* Mapping those slabs touched each of their pages once: faults were taken, and counted. */
  CHECK(s.page_faults > 0);
  /* A budget smaller than one batch fails when the loader is made, naming the option. */
  stoker_options *tight = t_options(source, NULL, "batch_size", "4", "memory_budget", "100", NULL);
  stoker_loader *none = (stoker_loader *)&s;
  CHECK_STATUS(stoker_loader_new(tight, &none), STOKER_ERR_INVALID_ARGUMENT);
  CHECK(none == NULL);
  CHECK_ERROR_HAS("memory_budget");
  CHECK_ERROR_HAS("100 bytes");
  stoker_options_free(tight);
  /* A budget of exactly one batch lowers the cap to 1, and says so. */
  char one_batch[32];
  snprintf(one_batch, sizeof one_batch, "%llu", (unsigned long long)s.batch_bytes);
  stoker_loader *lowered =
      t_loader(source, NULL, "batch_size", "4", "num_workers", "2", "memory_budget", one_batch, NULL);
  stoker_stats ls;
  ls.size = sizeof ls;
  CHECK_STATUS(stoker_loader_stats(lowered, &ls), STOKER_OK);
  CHECK(ls.in_flight_cap == 1 && ls.in_flight_cap_requested == 4);
  CHECK(ls.memory_budget == s.batch_bytes);
  CHECK(stoker_loader_next(lowered, &b) == STOKER_OK);
  stoker_batch_release(b);
  stoker_loader_free(lowered);

  /* An old caller that knew only size, batches and samples: nothing past them is written. */
  unsigned char raw[sizeof(stoker_stats)];
  memset(raw, 0xAB, sizeof raw);
  uint64_t old_size = 3 * sizeof(uint64_t);
  memcpy(raw, &old_size, sizeof old_size);
  CHECK_STATUS(stoker_loader_stats(l, (stoker_stats *)(void *)raw), STOKER_OK);
  uint64_t got[3];
  memcpy(got, raw, sizeof got);
  CHECK(got[0] == old_size && got[1] == 3 && got[2] == 10);
  for (size_t i = old_size; i < sizeof raw; i++) CHECK(raw[i] == 0xAB);

  /* A size that ends inside a field: only whole fields are written. */
  memset(raw, 0xAB, sizeof raw);
  old_size = 2 * sizeof(uint64_t) + 4;
  memcpy(raw, &old_size, sizeof old_size);
  CHECK_STATUS(stoker_loader_stats(l, (stoker_stats *)(void *)raw), STOKER_OK);
  memcpy(got, raw, 2 * sizeof(uint64_t));
  CHECK(got[1] == 3);
  for (size_t i = 2 * sizeof(uint64_t); i < sizeof raw; i++) CHECK(raw[i] == 0xAB);

  /* Just the size field: nothing to fill, still OK. */
  uint64_t only_size = sizeof(uint64_t);
  CHECK_STATUS(stoker_loader_stats(l, (stoker_stats *)(void *)&only_size), STOKER_OK);
  CHECK(only_size == sizeof(uint64_t));

  /* A newer caller: the known fields are filled, the unknown ones untouched. */
  newer_stats n;
  memset(&n, 0xAB, sizeof n);
  n.known.size = sizeof n;
  CHECK_STATUS(stoker_loader_stats(l, (stoker_stats *)&n), STOKER_OK);
  CHECK(n.known.size == sizeof n && n.known.batches == 3 && n.known.samples == 10);
  CHECK(n.known.readiness >= 0.0 && n.known.readiness <= 1.0);
  CHECK(n.future_a == 0xABABABABABABABABull && n.future_b == 0xABABABABABABABABull);

  /* A size that was never set. */
  s.size = 0;
  CHECK_STATUS(stoker_loader_stats(l, &s), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("sizeof(stoker_stats)");

  stoker_loader_free(l);
  t_tmp_cleanup(&tmp);
  return t_finish("test_stats");
}
