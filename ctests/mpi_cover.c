/* Run under `mpirun -np N`: each process is one rank of an Open MPI job. stoker reads the
 * OMPI_COMM_WORLD_* variables itself (rank=auto, world_size=auto), deals itself its share of
 * each epoch, and writes the sample rows it got, one per line, to DIR/rank-R.txt; the script
 * that runs it checks that the ranks together cover every sample exactly (padding aside) with
 * equal batch counts. It also checks what the stats say was resolved.
 *
 *   mpi_cover DIR ROWS EPOCHS */
#include "testutil.h"

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: mpi_cover DIR ROWS EPOCHS\n");
    return 2;
  }
  const char *dir = argv[1];
  int64_t rows = atoll(argv[2]);
  int epochs = atoi(argv[3]);
  const char *want_rank = getenv("OMPI_COMM_WORLD_RANK");
  const char *want_size = getenv("OMPI_COMM_WORLD_SIZE");
  CHECK(want_rank != NULL && want_size != NULL);
  if (!want_rank || !want_size) return t_finish("mpi_cover");

  /* Every rank writes the same dataset under its own name (no shared temp dir needed). */
  char npy[600], source[700];
  snprintf(npy, sizeof npy, "%s/data-%s.npy", dir, want_rank);
  uint8_t *data = malloc((size_t)rows * T_ROW);
  for (int64_t r = 0; r < rows; r++)
    for (int j = 0; j < T_ROW; j++) data[r * T_ROW + j] = t_value(r, j);
  int64_t shape[3] = {rows, 2, 3};
  t_write_npy(npy, "|u1", shape, 3, data, (size_t)rows * T_ROW, (size_t)-1);
  free(data);
  snprintf(source, sizeof source, "npy:%s", npy);

  stoker_loader *l = t_loader(source, NULL, "batch_size", "4", "shuffle", "true", "seed", "17",
                              NULL);
  stoker_stats st = {.size = sizeof st};
  CHECK_STATUS(stoker_loader_stats(l, &st), STOKER_OK);
  CHECK(st.launcher == STOKER_LAUNCHER_OPENMPI);
  CHECK((long long)st.rank == atoll(want_rank) && (long long)st.world_size == atoll(want_size));

  char out_path[700];
  snprintf(out_path, sizeof out_path, "%s/rank-%s.txt", dir, want_rank);
  FILE *out = fopen(out_path, "w");
  CHECK(out != NULL);
  if (!out) return t_finish("mpi_cover");
  int64_t got[64];
  for (int e = 0; e < epochs; e++) {
    for (;;) {
      stoker_batch *b = NULL;
      stoker_status s = stoker_loader_next(l, &b);
      if (s == STOKER_END_OF_EPOCH) break;
      CHECK_STATUS(s, STOKER_OK);
      if (s != STOKER_OK) break;
      int n = t_batch_rows(b, got);
      fprintf(out, "epoch %d batch", e);
      for (int i = 0; i < n; i++) fprintf(out, " %lld", (long long)got[i]);
      fprintf(out, "\n");
      stoker_batch_release(b);
    }
  }
  fclose(out);
  stoker_loader_free(l);
  unlink(npy);
  return t_finish("mpi_cover");
}
