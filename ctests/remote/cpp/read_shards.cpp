// Reads the shards served by ctests/remote/run.sh through the C++ API: every sample once per
// epoch, two epochs (the first streams, the second reads the cache), for each shard pattern
// given (http:// from nginx, s3:// from an S3 server), indexed and streaming; then a missing
// object must throw stoker::Error (IO) naming the URL and the HTTP status, without the secret
// key of the environment.
// Usage: read_shards CACHE_DIR SAMPLES PATTERN...
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <stoker/stoker.hpp>

namespace {

// One epoch: every label in [0, samples) exactly once, or a message saying what went wrong.
std::string check_epoch(stoker::Loader& loader, int64_t samples) {
  std::vector<bool> seen(static_cast<std::size_t>(samples));
  int64_t count = 0;
  for (auto& batch : loader.epoch()) {
    const stoker::TensorView& labels = batch.field("label");
    for (int64_t i = 0; i < labels.shape[0]; ++i) {
      int64_t v = labels.data_as<int64_t>()[i];
      if (v < 0 || v >= samples || seen[static_cast<std::size_t>(v)])
        return "label " + std::to_string(v) + " out of range or repeated";
      seen[static_cast<std::size_t>(v)] = true;
      ++count;
    }
  }
  if (count != samples)
    return std::to_string(count) + " samples, want " + std::to_string(samples);
  return {};
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc < 4) {
    std::fprintf(stderr, "usage: read_shards CACHE_DIR SAMPLES PATTERN...\n");
    return 2;
  }
  const int64_t samples = std::strtoll(argv[2], nullptr, 10);
  if (samples <= 0 || samples > 100000) return 2;
  for (int p = 3; p < argc; ++p) {
    for (std::size_t buffer : {0, 8}) {  // indexed, then streaming through a shuffle buffer
      stoker::Loader loader(stoker::Options()
                                .source(std::string("tar:") + argv[p])
                                .fields("cls:label")
                                .batch_size(3)
                                .shuffle(true)
                                .shuffle_buffer(buffer)
                                .shard_prefetch(2)
                                .cache_dir(argv[1]));
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::string problem = check_epoch(loader, samples);
        if (!problem.empty()) {
          std::fprintf(stderr, "read_shards: %s, epoch %d: %s\n", argv[p], epoch, problem.c_str());
          return 1;
        }
      }
      std::printf("c++: %s, shuffle_buffer=%zu: %lld samples per epoch, %llu batches\n", argv[p],
                  buffer, static_cast<long long>(samples),
                  static_cast<unsigned long long>(loader.stats().batches));
    }
  }

  std::string missing = argv[argc - 1];
  missing.replace(missing.find("shard-"), 6, "absent-");
  try {
    stoker::Loader loader(stoker::Options().source("tar:" + missing).fields("cls:label"));
    std::fprintf(stderr, "read_shards: %s: a missing object must fail\n", missing.c_str());
    return 1;
  } catch (const stoker::Error& e) {
    const std::string text = e.what();
    const char* secret = std::getenv("AWS_SECRET_ACCESS_KEY");
    if (e.status() != stoker::Status::Io || text.find("absent-000.tar") == std::string::npos ||
        text.find("HTTP 404") == std::string::npos ||
        (secret && *secret && text.find(secret) != std::string::npos)) {
      std::fprintf(stderr, "read_shards: missing object: unexpected error %s: %s\n",
                   stoker::to_string(e.status()), text.c_str());
      return 1;
    }
    std::printf("c++: missing object: %s\n", text.c_str());
  }
  return 0;
} catch (const stoker::Error& e) {
  std::fprintf(stderr, "read_shards: stoker error %s: %s\n", stoker::to_string(e.status()), e.what());
  return 1;
}
