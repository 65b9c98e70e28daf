// Compiled, never linked or run: the STOKER_WITH_TORCH_CUDA part of stoker/torch.hpp against
// LibTorch's c10/cuda headers (with tests/cuda_runtime_stub standing in for the CUDA toolkit's
// cuda_runtime_api.h), so that the helpers compiled out by default cannot rot unseen.
#ifndef STOKER_WITH_TORCH_CUDA
#error "build this file with STOKER_WITH_TORCH_CUDA defined"
#endif

#include <stoker/torch.hpp>

namespace {

[[maybe_unused]] std::vector<std::pair<std::string, torch::Tensor>> use(stoker::Batch&& batch) {
  stoker::wait_current_stream(batch);
  return stoker::to_tensors_on_current_stream(std::move(batch));
}

}  // namespace
