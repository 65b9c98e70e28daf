// The C++ example of the README: one epoch over an npy data set, then the loader's stats.
#include <cstdio>
#include <stoker/stoker.hpp>

int main() try {
  stoker::Loader loader(stoker::Options()
                            .source("npy:fixture_images.npy")  // uint8 [N, 3, 8, 8]
                            .labels("npy:fixture_labels.npy")  // int64 [N]
                            .batch_size(32)
                            .shuffle(true)
                            .seed(7));
  for (auto& batch : loader.epoch()) {
    const stoker::TensorView& images = batch.field("data");
    const stoker::TensorView& labels = batch.field("label");
    std::printf("batch %zu: images [%lld, %lld, %lld, %lld], first label %lld\n", batch.position(),
                (long long)images.shape[0], (long long)images.shape[1], (long long)images.shape[2],
                (long long)images.shape[3], (long long)labels.data_as<int64_t>()[0]);
  }
  std::printf("readiness %.3f\n", loader.stats().readiness);
} catch (const stoker::Error& e) {
  std::fprintf(stderr, "stoker error %s: %s\n", stoker::to_string(e.status()), e.what());
  return 1;
}
