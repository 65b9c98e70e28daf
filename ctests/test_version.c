/* Versions: the library's ABI and release versions match the header's macros. */
#include <stddef.h>

#include "testutil.h"

int main(void) {
  CHECK(stoker_abi_version() == STOKER_ABI_VERSION);
  CHECK(STOKER_ABI_VERSION == 1);
  const char *v = stoker_version();
  CHECK(v != NULL);
  if (v) {
    CHECK(strcmp(v, STOKER_VERSION) == 0);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", STOKER_VERSION_MAJOR, STOKER_VERSION_MINOR,
             STOKER_VERSION_PATCH);
    CHECK(strcmp(v, want) == 0);
    CHECK(v == stoker_version()); /* static storage */
  }
  CHECK(STOKER_MAX_DIMS == 8);
  /* Status values are the contract's. */
  CHECK(STOKER_OK == 0 && STOKER_END_OF_EPOCH == 1);
  CHECK(STOKER_ERR_INVALID_ARGUMENT == -1 && STOKER_ERR_IO == -2 && STOKER_ERR_DECODE == -3);
  CHECK(STOKER_ERR_UNSUPPORTED == -4 && STOKER_ERR_TIMEOUT == -5 && STOKER_ERR_CALLBACK == -6);
  CHECK(STOKER_ERR_CLOSED == -7 && STOKER_ERR_INTERNAL == -8);
  CHECK(STOKER_ERR_OUT_OF_MEMORY == -9 && STOKER_ERR_CUDA == -10);
  CHECK(STOKER_DTYPE_U8 == 0 && STOKER_DTYPE_I32 == 1 && STOKER_DTYPE_I64 == 2);
  CHECK(STOKER_DTYPE_F16 == 3 && STOKER_DTYPE_BF16 == 4 && STOKER_DTYPE_F32 == 5);
  CHECK(STOKER_DTYPE_U16 == 6); /* an addition: the codes before it keep their values */
  /* Layout of the public structs (fields are only ever appended). */
  CHECK(offsetof(stoker_stats, pin_failures) == 12 * 8);
  CHECK(offsetof(stoker_stats, rank) == 13 * 8 && offsetof(stoker_stats, launcher) == 17 * 8);
  CHECK(offsetof(stoker_stats, read_ns) == 18 * 8);
  CHECK(offsetof(stoker_stats, num_workers) == 23 * 8);
  CHECK(offsetof(stoker_stats, busy_ns) == 34 * 8);
  CHECK(offsetof(stoker_stats, in_flight_cap_requested) == 38 * 8);
  CHECK(offsetof(stoker_stats, autotune_decisions) == 40 * 8);
  CHECK(offsetof(stoker_stats, decoded_turbo_scaled) == 44 * 8);
  CHECK(offsetof(stoker_stats, batch_memory_peak_bytes) == 47 * 8);
  CHECK(offsetof(stoker_stats, page_faults) == 48 * 8);
  CHECK(offsetof(stoker_stats, device_memory_bytes) == 50 * 8);
  CHECK(offsetof(stoker_stats, gpu_decode_share) == 52 * 8);
  CHECK(sizeof(stoker_stats) == 53 * 8);
  CHECK(sizeof(stoker_launch) == 5 * 8);
  CHECK(STOKER_LAUNCHER_NONE == 0 && STOKER_LAUNCHER_EXPLICIT == 1 && STOKER_LAUNCHER_TORCHRUN == 2);
  CHECK(STOKER_LAUNCHER_SLURM == 3 && STOKER_LAUNCHER_OPENMPI == 4 && STOKER_LAUNCHER_PMI == 5);
  CHECK(sizeof(stoker_tensor) == 2 * sizeof(void *) + 4 * 4 + 2 * 8 * STOKER_MAX_DIMS);
  CHECK(sizeof(DLManagedTensorVersioned) == 8 + 2 * sizeof(void *) + 8 + sizeof(DLTensor));
  return t_finish("test_version");
}
