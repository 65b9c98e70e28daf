// Runs the kernels of cast.cu on the CPU, block by block and thread by thread, and checks every
// output element against what the kernel promises: `dst[i] = table[channel(i) * 256 + src[i]]`,
// NCHW's channel from the row, NHWC's from the column. The kernels use no shared memory and no
// synchronisation, so running the threads one after another is exact. Grids much smaller than
// the work exercise the strided loops; built with sanitizers, a stray index is an error.
//
// Built and run by check_kernels.py: c++ -std=c++14 -fsanitize=address,undefined emulate_cast.cpp

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

struct dim3 {
  unsigned int x, y, z;
};
static dim3 gridDim, blockDim, blockIdx, threadIdx;
#define __global__
#define __device__
#define __restrict__ __restrict

#include "cast.cu"

typedef void (*Kernel32)(const unsigned char*, unsigned int*, const unsigned int*, unsigned int,
                         unsigned int, unsigned int, unsigned int);
typedef void (*Kernel16)(const unsigned char*, unsigned short*, const unsigned short*,
                         unsigned int, unsigned int, unsigned int, unsigned int);

template <typename T, typename K>
static int check(K kernel, unsigned rows, unsigned plane, unsigned channels, bool by_column,
                 dim3 grid, unsigned block) {
  const size_t n = size_t(rows) * plane;
  std::vector<unsigned char> src(n);
  for (size_t i = 0; i < n; i++) src[i] = (unsigned char)((i * 37 + i / 7) % 256);
  std::vector<T> table(channels * 256);
  for (size_t i = 0; i < table.size(); i++) table[i] = T(i * 2654435761u);
  std::vector<T> dst(n, T(0));
  gridDim = grid;
  blockDim = {block, 1, 1};
  for (blockIdx.y = 0; blockIdx.y < grid.y; blockIdx.y++)
    for (blockIdx.x = 0; blockIdx.x < grid.x; blockIdx.x++)
      for (threadIdx.x = 0; threadIdx.x < block; threadIdx.x++)
        kernel(src.data(), dst.data(), table.data(), rows, plane, channels, by_column ? 1 : 0);
  for (size_t i = 0; i < n; i++) {
    size_t c = by_column ? (i % plane) % channels : (i / plane) % channels;
    T want = table[c * 256 + src[i]];
    if (dst[i] != want) {
      std::printf("FAIL: %zu-byte elements, %u rows of %u, %u channels, %s, grid %ux%u of %u: "
                  "element %zu is %llu, want %llu\n",
                  sizeof(T), rows, plane, channels, by_column ? "nhwc" : "nchw", grid.x, grid.y,
                  block, i, (unsigned long long)dst[i], (unsigned long long)want);
      return 1;
    }
  }
  return 0;
}

int main() {
  int failures = 0;
  // (rows, plane, channels, by_column): NCHW of 2 samples of 3 channels of 5x7, NHWC of 3 samples
  // of 4x5x3, a single channel, and 4 channels.
  const struct { unsigned rows, plane, channels; bool by_column; } shapes[] = {
      {6, 35, 3, false}, {3, 60, 3, true}, {5, 9, 1, false}, {2, 32, 4, true}, {1, 1, 3, false}};
  // The launch the library makes (256 threads, a block per 256 columns, a row per y) and grids
  // far smaller than the work.
  for (const auto& s : shapes) {
    const dim3 grids[] = {{(s.plane + 255) / 256, s.rows, 1}, {1, 1, 1}, {2, 3, 1}, {3, 2, 1}};
    const unsigned blocks[] = {256, 1, 4, 7};
    for (int g = 0; g < 4; g++) {
      failures += check<unsigned int>((Kernel32)stoker_cast_u8_b32, s.rows, s.plane, s.channels,
                                      s.by_column, grids[g], blocks[g]);
      failures += check<unsigned short>((Kernel16)stoker_cast_u8_b16, s.rows, s.plane,
                                        s.channels, s.by_column, grids[g], blocks[g]);
    }
  }
  std::printf("cast.cu on the CPU: %s\n", failures ? "FAILED" : "every element as promised");
  return failures ? 1 : 0;
}
