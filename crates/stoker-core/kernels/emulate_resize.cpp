// Runs the kernel of resize.cu on the CPU, block by block and thread by thread, and checks every
// output byte against what the kernel promises, computed here plainly from its contract: output
// pixel (x, y) is resampled pixel (flip ? width - 1 - x : x, y), each channel the vertical
// weighted sum of horizontal weighted sums rounded to bytes, every sum a chain of fused
// multiply-adds from zero in tap order and every rounding floor(v + 0.5) clamped to 0..255,
// stored in planes or interleaved. The kernel uses no shared memory and no synchronisation, so
// running the threads one after another is exact. Grids much smaller than the output exercise
// the strided loops; canary bytes around the output catch a stray write, and with sanitizers a
// stray read of the source or the taps is an error.
//
// The taps are those the library computes (the formula of `Taps::for_axis` in resize.rs: shrink,
// enlarge, identity copy, a crop with a clip), random ones, weights of either sign that push sums
// past 0 and 255 (the contract holds for any taps), and pairs of taps whose sum lands on the other
// side of a rounding boundary when the product is rounded before the add, along either axis: a
// kernel that does not fuse its multiply-adds fails on them.
//
// Built and run by check_kernels.py: c++ -std=c++14 -fsanitize=address,undefined emulate_resize.cpp

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <math.h>
#include <vector>

struct dim3 {
  unsigned int x, y, z;
};
static dim3 gridDim, blockDim, blockIdx, threadIdx;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __fmaf_rn(a, b, c) std::fmaf(a, b, c)

#include "resize.cu"

// One axis's taps, as the kernel reads them.
struct Taps {
  std::vector<unsigned int> spans;  // [first, count] per output pixel
  std::vector<float> weights;       // `taps` per output pixel
  unsigned int taps;
};

// The taps resize.rs computes (`Taps::for_axis`): bilinear, widened by the scale when shrinking,
// trimmed of zero weights at either end, normalised in double. Empty when refused.
static Taps library_taps(double start, double len, unsigned out, unsigned c0, unsigned c1) {
  Taps t;
  const double scale = len / out;
  const double filter_scale = std::max(scale, 1.0);
  const double radius = filter_scale;
  t.taps = unsigned(std::ceil(radius)) * 2 + 1;
  t.weights.assign(size_t(out) * t.taps, 0.0f);
  for (unsigned o = 0; o < out; o++) {
    const double in_center = start + (o + 0.5) * scale;
    const unsigned lo =
        std::min(unsigned(std::max(std::floor(in_center - radius), double(c0))), c1 - 1);
    const unsigned hi =
        std::max(unsigned(std::max(std::min(std::ceil(in_center + radius), double(c1)), 0.0)),
                 lo + 1);
    const double center = in_center - 0.5;
    std::vector<double> row;
    unsigned first = lo;
    for (unsigned x = lo; x < hi; x++) {
      const double d = std::fabs((x - center) / filter_scale);
      const double w = d < 1.0 ? 1.0 - d : 0.0;
      if (row.empty() && w == 0.0 && x + 1 < hi) {
        first = x + 1;
        continue;
      }
      row.push_back(w);
    }
    while (row.size() > 1 && row.back() == 0.0) row.pop_back();
    double sum = 0.0;
    for (double w : row) sum += w;
    if (row.size() > t.taps) return Taps();
    for (size_t k = 0; k < row.size(); k++)
      t.weights[size_t(o) * t.taps + k] = sum > 0.0 ? float(row[k] / sum) : 1.0f;
    t.spans.push_back(first);
    t.spans.push_back(unsigned(row.size()));
  }
  return t;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_random() {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return uint32_t(rng_state >> 32);
}

// Random taps over `src` source pixels: any span inside the source, of up to `taps` pixels, and
// weights in [-0.5, 1.5) (zero past the span, as the library's).
static Taps random_taps(unsigned out, unsigned src, unsigned taps) {
  Taps t;
  t.taps = taps;
  t.weights.assign(size_t(out) * taps, 0.0f);
  for (unsigned o = 0; o < out; o++) {
    const unsigned count = 1 + next_random() % std::min(taps, src);
    const unsigned first = next_random() % (src - count + 1);
    t.spans.push_back(first);
    t.spans.push_back(count);
    for (unsigned k = 0; k < count; k++)
      t.weights[size_t(o) * taps + k] = float(next_random() % 4096) / 2048.0f - 0.5f;
  }
  return t;
}

static unsigned char round_to_byte(float v) {
  float r = std::floor(v + 0.5f);
  if (r < 0.0f) r = 0.0f;
  if (r > 255.0f) r = 255.0f;
  return (unsigned char)r;
}

// Two taps, weights w0 and w1 over the values 1 and v1, that round to one byte when summed with
// fused multiply-adds (the contract) and to another when w1 * v1 is rounded before the add.
struct FusedPair {
  float w0, w1;
  unsigned char v1;
};
static FusedPair fused_pair() {
  for (;;) {
    FusedPair p;
    p.v1 = (unsigned char)(2 + next_random() % 254);
    p.w1 = float(next_random() >> 8) / 16777216.0f;
    volatile float product = p.w1 * float(p.v1);  // rounded once
    const float grid = std::nextafter(float(product), 1e9f) - product;
    // w0 brings the sum within a grid step of a half, by an amount finer than the grid.
    const float offset = (float(next_random() % 2048) / 1024.0f - 1.0f) * grid;
    p.w0 = (std::floor(product) + 0.5f - product) + offset;
    const float fused = std::fmaf(p.w1, float(p.v1), std::fmaf(p.w0, 1.0f, 0.0f));
    const float unfused = product + p.w0;
    if (round_to_byte(fused) != round_to_byte(unfused)) return p;
  }
}

// Taps of `out` pixels that all read `count` pixels from 0 with the same weights.
static Taps same_taps(unsigned out, std::vector<float> weights) {
  Taps t;
  t.taps = unsigned(weights.size());
  for (unsigned o = 0; o < out; o++) {
    t.spans.push_back(0);
    t.spans.push_back(t.taps);
    t.weights.insert(t.weights.end(), weights.begin(), weights.end());
  }
  return t;
}

// The contract, written plainly: channel by channel, pixel by pixel.
static std::vector<unsigned char> expected(const std::vector<unsigned char>& src, unsigned sw,
                                           unsigned w, unsigned h, bool planar, bool flip,
                                           const Taps& tx, const Taps& ty) {
  std::vector<unsigned char> out(size_t(w) * h * 3);
  for (unsigned c = 0; c < 3; c++) {
    for (unsigned y = 0; y < h; y++) {
      for (unsigned x = 0; x < w; x++) {
        const unsigned u = flip ? w - 1 - x : x;
        const unsigned fx = tx.spans[2 * u], nx = tx.spans[2 * u + 1];
        const unsigned fy = ty.spans[2 * y], ny = ty.spans[2 * y + 1];
        float sum = 0.0f;
        for (unsigned j = 0; j < ny; j++) {
          const unsigned r = fy + j;
          float hsum = 0.0f;
          for (unsigned k = 0; k < nx; k++) {
            const float v = src[size_t(r) * sw * 3 + size_t(fx + k) * 3 + c];
            hsum = std::fmaf(tx.weights[size_t(u) * tx.taps + k], v, hsum);
          }
          sum = std::fmaf(ty.weights[size_t(y) * ty.taps + j], float(round_to_byte(hsum)), sum);
        }
        const size_t at = planar ? size_t(c) * w * h + size_t(y) * w + x
                                 : (size_t(y) * w + x) * 3 + c;
        out[at] = round_to_byte(sum);
      }
    }
  }
  return out;
}

enum Kind { LIBRARY, RANDOM, FUSED_X, FUSED_Y };

struct Shape {
  const char* name;
  unsigned sw, sh, w, h;
  Kind kind;
  // Library taps: the source rectangle and clip along each axis.
  double left, width, top, height;
  unsigned x0, x1, y0, y1;
};

static const size_t GUARD = 64;

// Runs the kernel over `grid` blocks of `block` threads, twice (the output first filled with one
// byte, then another, so an unwritten byte cannot pass), and compares with `want`.
static int run(const Shape& s, bool planar, bool flip, const Taps& tx, const Taps& ty,
               const std::vector<unsigned char>& src, const std::vector<unsigned char>& want,
               dim3 grid, dim3 block) {
  const size_t n = size_t(s.w) * s.h * 3;
  for (const unsigned char fill : {(unsigned char)0xa5, (unsigned char)0x5a}) {
    std::vector<unsigned char> dst(GUARD + n + GUARD, fill);
    // Exactly sized copies, so the sanitizer sees a read one past any of them.
    std::vector<unsigned int> xs(tx.spans), ys(ty.spans);
    std::vector<float> xw(tx.weights), yw(ty.weights);
    gridDim = grid;
    blockDim = block;
    for (blockIdx.y = 0; blockIdx.y < grid.y; blockIdx.y++)
      for (blockIdx.x = 0; blockIdx.x < grid.x; blockIdx.x++)
        for (threadIdx.y = 0; threadIdx.y < block.y; threadIdx.y++)
          for (threadIdx.x = 0; threadIdx.x < block.x; threadIdx.x++)
            stoker_resize_u8(src.data(), s.sw, s.sh, dst.data() + GUARD, s.w, s.h, planar ? 1 : 0,
                             flip ? 1 : 0, xs.data(), xw.data(), tx.taps, ys.data(), yw.data(),
                             ty.taps);
    for (size_t i = 0; i < dst.size(); i++) {
      const bool inside = i >= GUARD && i < GUARD + n;
      const unsigned char good = inside ? want[i - GUARD] : fill;
      if (dst[i] != good) {
        std::printf("FAIL: %s (%ux%u to %ux%u), %s, flip %s, grid %ux%u of %ux%u: %s %lld is %u, "
                    "want %u\n",
                    s.name, s.sw, s.sh, s.w, s.h, planar ? "planar" : "interleaved",
                    flip ? "on" : "off", grid.x, grid.y, block.x, block.y,
                    inside ? "output byte" : "byte outside the output, at",
                    (long long)i - (long long)GUARD, dst[i], good);
        return 1;
      }
    }
  }
  return 0;
}

int main() {
  int failures = 0, cases = 0;
  const Shape shapes[] = {
      {"shrink", 37, 29, 11, 7, LIBRARY, 0.0, 37.0, 0.0, 29.0, 0, 37, 0, 29},
      {"enlarge", 5, 4, 17, 13, LIBRARY, 0.0, 5.0, 0.0, 4.0, 0, 5, 0, 4},
      {"identity copy", 9, 6, 9, 6, LIBRARY, 0.0, 9.0, 0.0, 6.0, 0, 9, 0, 6},
      {"crop of a clip, odd sizes", 41, 23, 13, 9, LIBRARY, 3.5, 27.25, 2.0, 17.5, 2, 35, 1, 21},
      {"a rectangle past the clip", 20, 20, 7, 5, LIBRARY, -4.0, 30.0, 12.0, 14.0, 0, 20, 0, 20},
      {"shrink by 31", 93, 62, 3, 2, LIBRARY, 0.0, 93.0, 0.0, 62.0, 0, 93, 0, 62},
      {"1x1 output", 15, 11, 1, 1, LIBRARY, 0.0, 15.0, 0.0, 11.0, 0, 15, 0, 11},
      {"1x1 source", 1, 1, 5, 3, LIBRARY, 0.0, 1.0, 0.0, 1.0, 0, 1, 0, 1},
      {"wide", 300, 3, 70, 2, LIBRARY, 0.0, 300.0, 0.0, 3.0, 0, 300, 0, 3},
      {"random taps, odd sizes", 19, 13, 23, 15, RANDOM, 0, 0, 0, 0, 0, 0, 0, 0},
      {"random taps, 1x1 output", 4, 3, 1, 1, RANDOM, 0, 0, 0, 0, 0, 0, 0, 0},
      {"fused multiply-adds across", 2, 1, 3, 2, FUSED_X, 0, 0, 0, 0, 0, 0, 0, 0},
      {"fused multiply-adds down", 1, 2, 3, 2, FUSED_Y, 0, 0, 0, 0, 0, 0, 0, 0},
  };
  for (const Shape& s : shapes) {
    Taps tx, ty;
    std::vector<unsigned char> src(size_t(s.sw) * s.sh * 3);
    for (auto& v : src) v = (unsigned char)next_random();
    if (s.kind == RANDOM) {
      tx = random_taps(s.w, s.sw, 5);
      ty = random_taps(s.h, s.sh, 4);
    } else if (s.kind == FUSED_X || s.kind == FUSED_Y) {
      // Every output pixel reads source pixels 1 and v1 through the pair along one axis, and
      // one pixel weighing 1 along the other.
      const FusedPair p = fused_pair();
      tx = s.kind == FUSED_X ? same_taps(s.w, {p.w0, p.w1}) : same_taps(s.w, {1.0f});
      ty = s.kind == FUSED_Y ? same_taps(s.h, {p.w0, p.w1}) : same_taps(s.h, {1.0f});
      for (size_t i = 0; i < src.size(); i++) src[i] = i < 3 ? 1 : p.v1;
    } else {
      tx = library_taps(s.left, s.width, s.w, s.x0, s.x1);
      ty = library_taps(s.top, s.height, s.h, s.y0, s.y1);
    }
    if (tx.spans.size() != 2 * size_t(s.w) || ty.spans.size() != 2 * size_t(s.h)) {
      std::printf("FAIL: %s: no taps\n", s.name);
      failures++;
      continue;
    }
    // The launch the library makes (`resize::grid`, blocks of RESIZE_BLOCK) and grids and
    // blocks far smaller than the output.
    const dim3 grids[] = {{(s.w + 31) / 32, (s.h + 7) / 8, 1}, {1, 1, 1}, {2, 3, 1}, {3, 2, 1}};
    const dim3 blocks[] = {{32, 8, 1}, {1, 1, 1}, {3, 2, 1}, {1, 4, 1}};
    for (const bool planar : {false, true}) {
      for (const bool flip : {false, true}) {
        const auto want = expected(src, s.sw, s.w, s.h, planar, flip, tx, ty);
        for (int g = 0; g < 4; g++) {
          failures += run(s, planar, flip, tx, ty, src, want, grids[g], blocks[g]);
          cases++;
        }
      }
    }
  }
  std::printf("resize.cu on the CPU: %s (%d launches)\n",
              failures ? "FAILED" : "every byte as promised, none outside the output", cases);
  return failures ? 1 : 0;
}
