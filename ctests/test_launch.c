/* Launcher variables set in the environment (Slurm, torchrun, Open MPI) reach the loader:
 * stoker_options_launch and the stats say what was resolved, the rank gets its share, and
 * inconsistent variables are errors naming them. Then stoker_loader_set_epoch. */
#include <stdlib.h>

#include "testutil.h"

#define ROWS 10

static const char *const LAUNCH_VARS[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_STEP_NUM_TASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID",
    "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"};

static void clear_launch_env(void) {
  for (size_t i = 0; i < sizeof LAUNCH_VARS / sizeof LAUNCH_VARS[0]; i++) unsetenv(LAUNCH_VARS[i]);
}

/* The rows of the rest of the epoch; returns how many. */
static int epoch_rows(stoker_loader *l, int64_t *out) {
  int n = 0;
  for (;;) {
    stoker_batch *b = NULL;
    stoker_status s = stoker_loader_next(l, &b);
    if (s == STOKER_END_OF_EPOCH) break;
    CHECK_STATUS(s, STOKER_OK);
    if (s != STOKER_OK) break;
    n += t_batch_rows(b, out + n);
    stoker_batch_release(b);
  }
  return n;
}

static stoker_launch launch_of(const char *source) {
  stoker_options *o = t_options(source, NULL, NULL);
  stoker_launch launch;
  CHECK_STATUS(stoker_options_launch(o, &launch), STOKER_OK);
  stoker_options_free(o);
  return launch;
}

int main(void) {
  t_tmp tmp;
  t_tmp_init(&tmp);
  char source[600];
  t_write_dataset(&tmp, ROWS, source, NULL, sizeof source);
  clear_launch_env();

  /* No launcher: one process. */
  stoker_launch none = launch_of(source);
  CHECK(none.rank == 0 && none.world_size == 1 && none.launcher == STOKER_LAUNCHER_NONE);

  /* srun -n 4 over two nodes of 2 tasks: this is task 3 (second on node 1). */
  setenv("SLURM_PROCID", "3", 1);
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
  stoker_launch slurm = launch_of(source);
  CHECK(slurm.rank == 3 && slurm.world_size == 4);
  CHECK(slurm.local_rank == 1 && slurm.local_world_size == 2);
  CHECK(slurm.launcher == STOKER_LAUNCHER_SLURM);
  /* Its loader deals itself order[3::4] and its stats say so. */
  stoker_loader *l = t_loader(source, NULL, "batch_size", "2", "num_workers", "2", NULL);
  int64_t rows[64];
  int n = epoch_rows(l, rows);
  CHECK(n == 3 && rows[0] == 3 && rows[1] == 7 && rows[2] == 1); /* 10 padded to 12 */
  stoker_stats st = {.size = sizeof st};
  CHECK_STATUS(stoker_loader_stats(l, &st), STOKER_OK);
  CHECK(st.rank == 3 && st.world_size == 4 && st.local_rank == 1 && st.local_world_size == 2);
  CHECK(st.launcher == STOKER_LAUNCHER_SLURM);
  stoker_loader_free(l);

  /* Explicit values win over the variables. */
  l = t_loader(source, NULL, "rank", "0", "world_size", "1", NULL);
  CHECK(epoch_rows(l, rows) == ROWS);
  stoker_loader_free(l);

  /* A stale torchrun pair inside a bigger srun step is an error naming the variables. */
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "2", 1);
  stoker_options *o = t_options(source, NULL, NULL);
  stoker_launch bad;
  CHECK_STATUS(stoker_options_launch(o, &bad), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("WORLD_SIZE=2");
  CHECK_ERROR_HAS("SLURM_NTASKS=4");
  CHECK(bad.world_size == 0);
  stoker_loader *none_made = NULL;
  CHECK_STATUS(stoker_loader_new(o, &none_made), STOKER_ERR_INVALID_ARGUMENT);
  CHECK(none_made == NULL);
  stoker_options_free(o);

  /* torchrun alone; then Open MPI alone. */
  clear_launch_env();
  setenv("RANK", "1", 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  stoker_launch torchrun = launch_of(source);
  CHECK(torchrun.rank == 1 && torchrun.world_size == 2 && torchrun.local_rank == 1);
  CHECK(torchrun.launcher == STOKER_LAUNCHER_TORCHRUN);
  clear_launch_env();
  setenv("OMPI_COMM_WORLD_RANK", "0", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
  stoker_launch ompi = launch_of(source);
  CHECK(ompi.rank == 0 && ompi.world_size == 3 && ompi.launcher == STOKER_LAUNCHER_OPENMPI);
  setenv("OMPI_COMM_WORLD_RANK", "3", 1); /* rank >= size */
  o = t_options(source, NULL, NULL);
  CHECK_STATUS(stoker_options_launch(o, &bad), STOKER_ERR_INVALID_ARGUMENT);
  CHECK_ERROR_HAS("OMPI_COMM_WORLD_RANK=3");
  stoker_options_free(o);
  clear_launch_env();

  /* set_epoch: the next batch is the first of that epoch, work in flight discarded. */
  int64_t e2[64], got[64];
  l = t_loader(source, NULL, "batch_size", "3", "shuffle", "true", "num_workers", "2", NULL);
  epoch_rows(l, got);
  epoch_rows(l, got);
  int n2 = epoch_rows(l, e2);
  stoker_loader_free(l);
  l = t_loader(source, NULL, "batch_size", "3", "shuffle", "true", "num_workers", "2", NULL);
  stoker_batch *held = NULL;
  CHECK_STATUS(stoker_loader_next(l, &held), STOKER_OK);
  CHECK_STATUS(stoker_loader_set_epoch(l, 2), STOKER_OK);
  CHECK(stoker_loader_epoch(l) == 2);
  int m = epoch_rows(l, got);
  CHECK(m == n2 && memcmp(got, e2, sizeof(int64_t) * (size_t)n2) == 0);
  CHECK(stoker_loader_epoch(l) == 3);
  CHECK(t_batch_rows(held, got) == 3); /* a held batch stays valid */
  stoker_batch_release(held);
  CHECK_STATUS(stoker_loader_set_epoch(NULL, 1), STOKER_ERR_INVALID_ARGUMENT);
  stoker_loader_free(l);

  t_tmp_cleanup(&tmp);
  return t_finish("test_launch");
}
