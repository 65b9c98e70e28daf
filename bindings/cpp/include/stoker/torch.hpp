// stoker ↔ LibTorch: batch fields as torch::Tensor, with zero copies.
//
//   auto batch = std::make_shared<stoker::Batch>(std::move(*loader.next()));
//   torch::Tensor images = stoker::to_tensor(batch, "data");   // views the batch memory
//   torch::Tensor labels = stoker::to_tensor(batch, "label");
//
// The tensor's deleter holds a std::shared_ptr to the batch: the batch memory stays leased until
// the last tensor (or view of one) that uses it is destroyed, even after the Batch object, its
// shared_ptr and the Loader are gone. The memory is writable: the batch owns it exclusively, so an
// in-place op (images.div_(255) on a float field, say) is fine.
//
// CUDA batches (a `device("cuda")` loader) become CUDA tensors on the batch's device
// (torch::kCUDA, device_id), still zero copy: the tensor views the loader's device buffer, which
// returns to the loader's ring when the last tensor over it is freed. The copy into that buffer
// runs on the loader's stream and may still be running when the batch is handed out, so before
// using the tensors make your stream wait for it:
//
//   batch->wait(at::cuda::getCurrentCUDAStream().stream());   // <ATen/cuda/CUDAContext.h>
//
// (or `batch->synchronize()` to block the CPU). Call `wait` for every stream that uses them.
// Built with CUDA LibTorch, define STOKER_WITH_TORCH_CUDA (before including this header, or with
// -DSTOKER_WITH_TORCH_CUDA) to get `stoker::wait_current_stream(batch)` and
// `stoker::to_tensors_on_current_stream(batch)`, which do that for you. It is off by default: the
// header then includes no CUDA headers and works with CPU-only LibTorch, where to_tensor on a CUDA
// batch throws UNSUPPORTED.
//
// LibTorch's headers need C++20; this header is the only part of stoker's C++ API that does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/cuda.h>
#include <torch/types.h>

#if defined(STOKER_WITH_TORCH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include "stoker/stoker.hpp"

namespace stoker {

inline c10::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::U8: return torch::kUInt8;
    case DType::I32: return torch::kInt32;
    case DType::I64: return torch::kInt64;
    case DType::F16: return torch::kFloat16;
    case DType::BF16: return torch::kBFloat16;
    case DType::F32: return torch::kFloat32;
    case DType::U16: return torch::kUInt16;
  }
  throw Error(Status::InvalidArgument, "unknown stoker dtype " + std::to_string(static_cast<uint32_t>(d)));
}

// A tensor over `view`'s memory that keeps `batch` alive until the tensor's storage is freed.
// `view` must be one of `batch`'s fields.
inline torch::Tensor to_tensor(std::shared_ptr<const Batch> batch, const TensorView& view) {
  // DLPack device codes: 1 CPU, 2 CUDA, 3 CUDA host (page-locked, still CPU-addressable).
  torch::Device device(torch::kCPU);
  if (view.device_type == 2) {
    if (!torch::cuda::is_available()) {
      throw Error(Status::Unsupported, "field `" + view.name + "` is in CUDA memory (device " +
                                           std::to_string(view.device_id) +
                                           ") but this LibTorch sees no CUDA device (a CPU-only build?)");
    }
    device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(view.device_id));
  } else if (view.device_type != 1 && view.device_type != 3) {
    throw Error(Status::Unsupported, "field `" + view.name + "` is on DLPack device type " +
                                         std::to_string(view.device_type) +
                                         "; stoker/torch.hpp wraps CPU and CUDA memory only");
  }
  auto options = torch::TensorOptions().dtype(scalar_type(view.dtype)).device(device);
  return torch::from_blob(
      view.data, view.shape, view.strides,
      // The deleter owns a reference to the batch: the lease ends when the tensor storage dies.
      [keep = std::move(batch)](void*) mutable { keep.reset(); }, options);
}

// Field `i` of `batch` as a tensor (zero copy); throws INVALID_ARGUMENT when out of range.
inline torch::Tensor to_tensor(const std::shared_ptr<const Batch>& batch, std::size_t i) {
  return to_tensor(batch, batch->field(i));
}

// The field called `name` as a tensor (zero copy); throws INVALID_ARGUMENT when absent.
inline torch::Tensor to_tensor(const std::shared_ptr<const Batch>& batch, std::string_view name) {
  return to_tensor(batch, batch->field(name));
}

// Every field of `batch`, in field order, as (name, tensor) pairs; the batch moves into shared
// ownership of the tensors.
inline std::vector<std::pair<std::string, torch::Tensor>> to_tensors(Batch&& batch) {
  auto shared = std::make_shared<const Batch>(std::move(batch));
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const TensorView& view : shared->fields()) out.emplace_back(view.name, to_tensor(shared, view));
  return out;
}

#if defined(STOKER_WITH_TORCH_CUDA)
// Makes LibTorch's current CUDA stream of the batch's device wait for the batch's copy (no CPU
// block); nothing for a host batch. Call it on the thread, and with the current stream, that
// will use the batch's tensors.
inline void wait_current_stream(const Batch& batch) {
  if (!batch.is_cuda() || batch.num_fields() == 0) return;
  const auto index = static_cast<c10::DeviceIndex>(batch.field(0).device_id);
  batch.wait(c10::cuda::getCurrentCUDAStream(index).stream());
}

// to_tensors(), after making the current CUDA stream wait for the copy.
inline std::vector<std::pair<std::string, torch::Tensor>> to_tensors_on_current_stream(Batch&& batch) {
  wait_current_stream(batch);
  return to_tensors(std::move(batch));
}
#endif

}  // namespace stoker
