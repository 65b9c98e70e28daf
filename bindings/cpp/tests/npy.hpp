// Writes NumPy .npy files (format 1.0, C order, little-endian) for the tests and examples.
#pragma once

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace stoker_test {

// `descr` is NumPy's type string: "|u1", "<i8", "<f4", ...
inline void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
                      const void* data, std::size_t nbytes) {
  std::string shape_text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    shape_text += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  }
  shape_text += ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
  // Magic (6) + version (2) + length (2) + header + '\n' is padded to a multiple of 64.
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const char magic[] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  out.write(magic, sizeof magic);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_le[] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(nbytes));
  if (!out) throw std::runtime_error("cannot write " + path);
}

template <class T>
void write_npy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape,
               const std::vector<T>& values) {
  write_npy(path, descr, shape, values.data(), values.size() * sizeof(T));
}

}  // namespace stoker_test
