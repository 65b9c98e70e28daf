// Writes the small data set the README example and the install consumer read:
// fixture_images.npy (uint8 [100, 3, 8, 8], every byte of image i equal to i) and
// fixture_labels.npy (int64 [100], label of image i = i % 10), into the current directory.
#include <cstdint>
#include <vector>

#include "npy.hpp"

int main() {
  const int64_t n = 100, c = 3, h = 8, w = 8;
  std::vector<uint8_t> images(static_cast<std::size_t>(n * c * h * w));
  std::vector<int64_t> labels(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < c * h * w; ++j) images[static_cast<std::size_t>(i * c * h * w + j)] = static_cast<uint8_t>(i);
    labels[static_cast<std::size_t>(i)] = i % 10;
  }
  stoker_test::write_npy("fixture_images.npy", "|u1", {n, c, h, w}, images);
  stoker_test::write_npy("fixture_labels.npy", "<i8", {n}, labels);
  return 0;
}
