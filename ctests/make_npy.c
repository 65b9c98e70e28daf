/* Writes the standard test dataset (uint8 [ROWS, 2, 3]) to PATH: the data of the example test and
 * of the consumer project. Usage: make_npy PATH ROWS */
#include "testutil.h"

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s PATH ROWS\n", argv[0]);
    return 2;
  }
  int64_t rows = atoll(argv[2]);
  uint8_t data[36 * T_ROW];
  if (rows < 1 || rows > 36) return 2;
  for (int64_t r = 0; r < rows; r++)
    for (int j = 0; j < T_ROW; j++) data[r * T_ROW + j] = t_value(r, j);
  int64_t shape[3] = {rows, 2, 3};
  t_write_npy(argv[1], "|u1", shape, 3, data, (size_t)rows * T_ROW, (size_t)-1);
  return 0;
}
