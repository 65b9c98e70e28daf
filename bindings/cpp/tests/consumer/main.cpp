// Links the installed stoker::cxx, reads one epoch of a small npy file and checks it.
#include <cstdint>
#include <cstdio>
#include <vector>

#include <stoker/stoker.hpp>

#include "npy.hpp"

int main() try {
  std::vector<float> values(30);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  stoker_test::write_npy("consumer_data.npy", "<f4", {10, 3}, values);

  stoker::Loader loader(stoker::Options().source("npy:consumer_data.npy").batch_size(4));
  double sum = 0;
  int batches = 0;
  for (auto& batch : loader.epoch()) {
    const stoker::TensorView& data = batch.field("data");
    for (int64_t i = 0; i < data.numel(); ++i) sum += data.data_as<float>()[i];
    ++batches;
  }
  std::printf("consumer: stoker %s, %d batches, sum %.0f\n", stoker::version().c_str(), batches, sum);
  return batches == 3 && sum == 435 ? 0 : 1;
} catch (const stoker::Error& e) {
  std::fprintf(stderr, "stoker error %s: %s\n", stoker::to_string(e.status()), e.what());
  return 1;
}
