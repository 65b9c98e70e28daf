// Example trainer: a tiny CNN trained with LibTorch on batches from stoker, handed over with zero
// copies through stoker/torch.hpp.
//
//   stoker_train [--source SPEC] [--labels SPEC] [--transform SPEC] [--classes N] [--steps N]
//                [--batch-size N] [--workers N]
//
// Without --source it writes a synthetic data set to the current directory and trains on it:
// uint8 [2048, 3, 32, 32] images whose class (0-3) is the quadrant holding a bright square, plus
// noise, and int64 labels. Any stoker source works, e.g. (once the image pipeline is in)
//   stoker_train --source image_folder:/data/train --transform "random_resized_crop(64) | normalize(imagenet)" --classes 10
// The first field of each batch is the input ([N, C, H, W], uint8 is scaled to [0, 1]); the
// field `label` is the target. Exits non-zero if the loss did not go down.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <stoker/stoker.hpp>
#include <stoker/torch.hpp>

#include "npy.hpp"

namespace {

struct Args {
  std::string source, labels, transform;
  int64_t classes = 4;
  int steps = 60;
  std::size_t batch_size = 64;
  std::size_t workers = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", flag.c_str());
      std::exit(2);
    }
    std::string value = argv[++i];
    if (flag == "--source") a.source = value;
    else if (flag == "--labels") a.labels = value;
    else if (flag == "--transform") a.transform = value;
    else if (flag == "--classes") a.classes = std::stoll(value);
    else if (flag == "--steps") a.steps = std::stoi(value);
    else if (flag == "--batch-size") a.batch_size = std::stoul(value);
    else if (flag == "--workers") a.workers = std::stoul(value);
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      std::exit(2);
    }
  }
  return a;
}

// The synthetic data set: class k has a bright 12x12 square in quadrant k.
void write_synthetic(const std::string& images_path, const std::string& labels_path) {
  const int64_t n = 2048, c = 3, h = 32, w = 32;
  std::vector<uint8_t> images(static_cast<std::size_t>(n * c * h * w));
  std::vector<int64_t> labels(static_cast<std::size_t>(n));
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> noise(0, 90), jitter(0, 4);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i % 4;
    labels[static_cast<std::size_t>(i)] = k;
    const int64_t y0 = (k / 2) * 16 + jitter(rng), x0 = (k % 2) * 16 + jitter(rng);
    for (int64_t ch = 0; ch < c; ++ch) {
      for (int64_t y = 0; y < h; ++y) {
        for (int64_t x = 0; x < w; ++x) {
          const bool square = y >= y0 && y < y0 + 12 && x >= x0 && x < x0 + 12;
          images[static_cast<std::size_t>(((i * c + ch) * h + y) * w + x)] =
              static_cast<uint8_t>(noise(rng) + (square ? 160 : 0));
        }
      }
    }
  }
  stoker_test::write_npy(images_path, "|u1", {n, c, h, w}, images);
  stoker_test::write_npy(labels_path, "<i8", {n}, labels);
}

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t classes)
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).stride(2).padding(1)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 3).stride(2).padding(1)))),
        fc(register_module("fc", torch::nn::Linear(16 * 4 * 4, classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));
    x = torch::relu(conv2(x));
    x = torch::adaptive_avg_pool2d(x, {4, 4});  // any input size; keeps coarse position
    return fc(x.flatten(1));
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc;
};
TORCH_MODULE(Net);

}  // namespace

int main(int argc, char** argv) try {
  Args args = parse(argc, argv);
  if (args.source.empty()) {
    write_synthetic("train_images.npy", "train_labels.npy");
    args.source = "npy:train_images.npy";
    args.labels = "npy:train_labels.npy";
  }
  // The loader's workers and the model share the cores: one intra-op thread for the model.
  torch::set_num_threads(1);
  torch::manual_seed(0);

  stoker::Options options;
  options.source(args.source).batch_size(args.batch_size).shuffle(true).seed(1).num_workers(args.workers);
  if (!args.labels.empty()) options.labels(args.labels);
  if (!args.transform.empty()) options.transform(args.transform);
  stoker::Loader loader(options);
  if (loader.batches_per_epoch() == 0) {
    std::fprintf(stderr, "the source has no full batch\n");
    return 1;
  }

  Net net(args.classes);
  torch::optim::Adam optimizer(net->parameters(), torch::optim::AdamOptions(3e-3));
  std::vector<double> losses;
  while (static_cast<int>(losses.size()) < args.steps) {
    for (auto& batch : loader.epoch()) {
      auto lease = std::make_shared<const stoker::Batch>(std::move(batch));
      torch::Tensor input = stoker::to_tensor(lease, std::size_t{0});  // zero copy
      torch::Tensor target = stoker::to_tensor(lease, "label");
      if (input.scalar_type() == torch::kUInt8) input = input.to(torch::kFloat32).div_(255);

      optimizer.zero_grad();
      torch::Tensor loss = torch::nn::functional::cross_entropy(net->forward(input), target);
      loss.backward();
      optimizer.step();
      losses.push_back(loss.item<double>());
      std::printf("epoch %llu step %3zu  loss %.4f\n", static_cast<unsigned long long>(lease->epoch()),
                  losses.size(), losses.back());
      if (static_cast<int>(losses.size()) == args.steps) break;
    }
  }

  const stoker::Stats stats = loader.stats();
  std::printf("loader: %llu batches, readiness %.3f (consumer waited %.1f ms of %.1f ms), worker busy %.3f\n",
              static_cast<unsigned long long>(stats.batches), stats.readiness, stats.wait_ns_total / 1e6,
              stats.elapsed_ns / 1e6, stats.worker_busy);

  const std::size_t k = std::min<std::size_t>(5, losses.size() / 2);
  double first = 0, last = 0;
  for (std::size_t i = 0; i < k; ++i) {
    first += losses[i] / static_cast<double>(k);
    last += losses[losses.size() - 1 - i] / static_cast<double>(k);
  }
  std::printf("mean loss of the first %zu steps %.4f, of the last %zu steps %.4f\n", k, first, k, last);
  if (k == 0 || !(last < first)) {
    std::fprintf(stderr, "FAIL: the loss did not decrease\n");
    return 1;
  }
  return 0;
} catch (const stoker::Error& e) {
  std::fprintf(stderr, "stoker error %s: %s\n", stoker::to_string(e.status()), e.what());
  return 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
