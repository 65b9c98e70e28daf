// stoker: a data loader for ML training — the C++17 API.
//
//   stoker::Loader loader(stoker::Options()
//                             .source("npy:images.npy")
//                             .labels("npy:labels.npy")
//                             .batch_size(64)
//                             .shuffle(true));
//   for (auto& batch : loader.epoch()) {
//     const stoker::TensorView& images = batch.field("data");
//     ...
//   }
//
// With `.device("cuda")` (or "cuda:N") the batches are in device memory: each field's `data` is a
// device pointer (`device_type` 2, `device_id` N), and its copy may still be running. Before
// reading a batch on a CUDA stream call `batch.wait(stream)` (the stream waits, the CPU does
// not), or `batch.synchronize()` to block. See `Batch::wait`.
//
// Linking: use the CMake target `stoker::cxx`. It is one Rust static library (libstoker_cxx.a)
// that already contains the whole engine (stoker-core) and Rust's standard library. A binary may
// contain only one Rust staticlib: do NOT also link the C ABI's `libstoker.a` (target
// `stoker::stoker_static`) into the same program. C++ programs use `stoker::cxx`; C programs
// (and runtimes that dlopen) use the C ABI library `libstoker`.
//
// Errors are thrown as `stoker::Error` (a `std::runtime_error`) carrying a `stoker::Status` with
// the values of the C ABI's `stoker_status`.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rust/cxx.h"
#include "stoker-cxx/src/lib.rs.h"

namespace stoker {

// The C ABI's `stoker_status` values.
enum class Status : int32_t {
  Ok = 0,
  EndOfEpoch = 1,
  InvalidArgument = -1,
  Io = -2,
  Decode = -3,
  Unsupported = -4,
  Timeout = -5,
  Callback = -6,
  Closed = -7,
  Internal = -8,
  OutOfMemory = -9,
  Cuda = -10,
};

inline const char* to_string(Status s) noexcept {
  switch (s) {
    case Status::Ok: return "OK";
    case Status::EndOfEpoch: return "END_OF_EPOCH";
    case Status::InvalidArgument: return "INVALID_ARGUMENT";
    case Status::Io: return "IO";
    case Status::Decode: return "DECODE";
    case Status::Unsupported: return "UNSUPPORTED";
    case Status::Timeout: return "TIMEOUT";
    case Status::Callback: return "CALLBACK";
    case Status::Closed: return "CLOSED";
    case Status::Internal: return "INTERNAL";
    case Status::OutOfMemory: return "OUT_OF_MEMORY";
    case Status::Cuda: return "CUDA";
  }
  return "UNKNOWN";
}

// Everything stoker reports: the status and a message naming the key, file or sample index.
class Error : public std::runtime_error {
 public:
  Error(Status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  Status status() const noexcept { return status_; }

 private:
  Status status_;
};

// The C ABI's `stoker_dtype` values.
enum class DType : uint32_t { U8 = 0, I32 = 1, I64 = 2, F16 = 3, BF16 = 4, F32 = 5, U16 = 6 };

inline std::size_t dtype_size(DType d) noexcept {
  switch (d) {
    case DType::U8: return 1;
    case DType::U16:
    case DType::F16:
    case DType::BF16: return 2;
    case DType::I32:
    case DType::F32: return 4;
    case DType::I64: return 8;
  }
  return 0;
}

inline const char* to_string(DType d) noexcept {
  switch (d) {
    case DType::U8: return "uint8";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::F32: return "float32";
    case DType::U16: return "uint16";
  }
  return "unknown";
}

namespace detail {

// Turns the bridge's `rust::Error` ("<status>|<message>") into a `stoker::Error`.
[[noreturn]] inline void rethrow(const rust::Error& e) {
  std::string what = e.what();
  std::size_t bar = what.find('|');
  if (bar != std::string::npos && bar > 0) {
    const std::string code = what.substr(0, bar);
    char* end = nullptr;
    long value = std::strtol(code.c_str(), &end, 10);
    if (end != nullptr && *end == '\0' && value >= -10 && value <= -1) {
      throw Error(static_cast<Status>(value), what.substr(bar + 1));
    }
  }
  throw Error(Status::Internal, what);
}

// Calls into the bridge, translating its errors.
template <class F>
auto call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const rust::Error& e) {
    rethrow(e);
  }
}

inline rust::Slice<const uint8_t> bytes(std::string_view s) noexcept {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace detail

inline std::string version() { return std::string(ffi::version()); }

// stoker's packed format (docs/packed-format.md): `stoker pack` from C++.
struct PackOptions {
  uint32_t max_side = 0;       // shrink images whose longer side is larger; 0 keeps every size
  uint32_t quality = 90;       // JPEG quality of re-encoded images, 1 to 100
  std::string mode = "jpeg";   // "jpeg", "raw" or "smart"
  uint64_t shard_size = 0;     // bytes of data per shard file; 0 writes one file
  uint32_t shard_index = 0;    // with num_shards: pack only this contiguous slice
  uint32_t num_shards = 0;     // 0 packs the whole source
};

// Packs the source spec `src` (image_folder:, tar:, npy:, packed:) into `out`, read back with
// `source("packed:" + out)`. Throws stoker::Error naming what is wrong.
inline void pack(std::string_view src, std::string_view out, const PackOptions& options = {}) {
  detail::call([&] {
    ffi::pack(detail::bytes(src), detail::bytes(out), options.max_side, options.quality,
              detail::bytes(options.mode), options.shard_size, options.shard_index, options.num_shards);
  });
}

// Writes the index of the slices packed into the directory `out` (stoker pack --merge).
inline void pack_merge(std::string_view out) {
  detail::call([&] { ffi::pack_merge(detail::bytes(out)); });
}

// The sample a custom Source is filling, valid only during one `Source::get` call. Data is
// copied before each put_* returns. Fields, their dtypes and shapes are fixed by sample 0; every
// put_* throws `stoker::Error` (INVALID_ARGUMENT) on misuse.
class Sample {
 public:
  explicit Sample(ffi::SampleHandle& handle) noexcept : handle_(handle) {}
  Sample(const Sample&) = delete;
  Sample& operator=(const Sample&) = delete;

  // Encoded JPEG or PNG bytes, decoded and transformed into the field `image`.
  void put_encoded(const void* bytes, std::size_t len) {
    if (bytes == nullptr && len != 0) throw Error(Status::InvalidArgument, "put_encoded: null bytes");
    detail::call([&] { handle_.put_encoded({static_cast<const uint8_t*>(bytes), len}); });
  }
  // A C-contiguous tensor of `shape` for `field`; `data` holds its bytes.
  void put_tensor(std::string_view field, DType dtype, const std::vector<int64_t>& shape, const void* data) {
    std::size_t bytes = dtype_size(dtype);
    for (int64_t d : shape) {
      if (d < 0) throw Error(Status::InvalidArgument, "put_tensor `" + std::string(field) + "`: negative dimension");
      bytes *= static_cast<std::size_t>(d);
    }
    if (data == nullptr && bytes != 0) {
      throw Error(Status::InvalidArgument, "put_tensor `" + std::string(field) + "`: null data");
    }
    detail::call([&] {
      handle_.put_tensor(detail::bytes(field), static_cast<uint32_t>(dtype), {shape.data(), shape.size()},
                         {static_cast<const uint8_t*>(data), bytes});
    });
  }
  // The sample's label: the int64 field `label`.
  void put_label(int64_t label) {
    detail::call([&] { handle_.put_label(label); });
  }

 private:
  ffi::SampleHandle& handle_;
};

// The trainer's own dataset, map-style (PyTorch's Dataset.__getitem__): stoker calls `get` from
// its worker threads, concurrently, and does the rest (transforms, collate, prefetch).
// Both methods must be thread-safe. An exception thrown by `get` fails that sample with status
// CALLBACK and the exception's what() (or, with on_error=skip, replaces it and counts it).
class Source {
 public:
  virtual ~Source() = default;
  // Number of samples; read once, when the source is given to Options.
  virtual uint64_t size() const = 0;
  // Fills `out` with sample `index` (< size()).
  virtual void get(uint64_t index, Sample& out) const = 0;
};

// Which stream an IterableSource is asked for: this rank's share of one epoch. `worker` is
// always 0 and `num_workers` 1: stoker reads one stream per rank, in order, so that batches are
// the same for a seed whatever num_workers is (its workers still decode and collate in parallel).
struct StreamInfo {
  uint64_t rank = 0;
  uint64_t world_size = 1;
  uint64_t worker = 0;
  uint64_t num_workers = 1;
  uint64_t seed = 0;
  uint64_t epoch = 0;
};

// One open stream of an IterableSource. stoker calls its methods one at a time, possibly from
// different threads (its own, then its feeder thread's), and destroys it (on any thread) when the
// stream ended or is no longer needed: that is the stream's close.
class SampleStream {
 public:
  virtual ~SampleStream() = default;
  // Fills `out` with the next sample and returns true, or returns false at the end of the stream.
  // The first sample of the first stream fixes the fields, as sample 0 of a Source. An exception
  // fails this sample with status CALLBACK and its what() (or, with on_error=skip, replaces it);
  // the stream is then asked for the next one.
  virtual bool next(Sample& out) = 0;
  // The position after the samples given so far, to reopen the stream there (see
  // IterableSource::open); std::nullopt if it cannot say. Used only with shuffle_buffer 0.
  virtual std::optional<std::string> save_state() { return std::nullopt; }
};

// The trainer's own stream of samples with no length (PyTorch's IterableDataset). stoker opens
// one stream per rank and epoch and reads it to its end (the epoch's end). A stream must give the
// same samples for the same StreamInfo: a resumed loader replays the epoch from its start unless
// the stream saves its state. With the option `num_samples` every rank delivers the same number
// of samples (a stream that ends sooner is opened again), so ranks get equal batch counts.
// `open` and `saves_state` must be thread-safe.
class IterableSource {
 public:
  virtual ~IterableSource() = default;
  // The stream `info` describes; `resume` is null, or a state one of its streams saved: continue
  // after it. Throw to fail (the loader reports CALLBACK with the exception's what()).
  virtual std::unique_ptr<SampleStream> open(const StreamInfo& info, const std::string* resume) const = 0;
  // Whether its streams implement save_state.
  virtual bool saves_state() const { return false; }
};

// Loader options: string keys of the C ABI (documented in stoker.h), validated when set. Every
// setter throws `stoker::Error` (INVALID_ARGUMENT, naming the key) on an unknown key or a bad
// value, and returns *this for chaining.
class Options {
 public:
  Options() : handle_(ffi::options_new()) {}
  Options(const Options& other) : handle_(ffi::options_clone(*other.handle_)) {}
  Options& operator=(const Options& other) {
    if (this != &other) handle_ = ffi::options_clone(*other.handle_);
    return *this;
  }
  // No move operations: a moved-from rust::Box would be null, so moving copies (cheaply).

  Options& set(std::string_view key, std::string_view value) {
    detail::call([&] { handle_->set(detail::bytes(key), detail::bytes(value)); });
    return *this;
  }

  // One typed setter per option key, named as the key: each converts its value to the string the
  // key takes and calls set(). What a key means, its values and default: the option table of
  // stoker.h (docs/options.md). A test checks that these setters cover exactly the table's keys.

  // A source spec (`npy:PATH`, `image_folder:ROOT`, `tar:PATTERN`, `packed:PATH`).
  Options& source(std::string_view spec) { return set("source", spec); }
  // A custom source; the options (and every loader made from them) share it.
  Options& source(std::shared_ptr<const Source> source) {
    if (!source) throw Error(Status::InvalidArgument, "source: null stoker::Source");
    auto bridge = std::make_unique<ffi::SourceBridge>(std::move(source));
    detail::call([&] { handle_->set_source(std::move(bridge)); });
    return *this;
  }
  // An iterable source; the options (and every loader made from them) share it.
  // Loader::batches_per_epoch() is -1 for it unless `num_samples` is set.
  Options& source(std::shared_ptr<const IterableSource> source) {
    if (!source) throw Error(Status::InvalidArgument, "source: null stoker::IterableSource");
    auto bridge = std::make_unique<ffi::IterableBridge>(std::move(source));
    detail::call([&] { handle_->set_iterable(std::move(bridge)); });
    return *this;
  }
  Options& labels(std::string_view spec) { return set("labels", spec); }
  Options& batch_size(std::size_t n) { return set("batch_size", std::to_string(n)); }
  Options& shuffle(bool on) { return set("shuffle", flag(on)); }
  Options& seed(uint64_t seed) { return set("seed", std::to_string(seed)); }
  Options& drop_last(bool on) { return set("drop_last", flag(on)); }
  Options& num_workers(std::size_t n) { return set("num_workers", std::to_string(n)); }
  Options& num_workers_auto() { return set("num_workers", "auto"); }
  Options& prefetch_factor(std::size_t n) { return set("prefetch_factor", std::to_string(n)); }
  Options& in_order(bool on) { return set("in_order", flag(on)); }
  Options& rank(std::size_t r) { return set("rank", std::to_string(r)); }
  Options& world_size(std::size_t n) { return set("world_size", std::to_string(n)); }
  Options& shard_drop_last(bool on) { return set("shard_drop_last", flag(on)); }
  Options& replacement(bool on) { return set("replacement", flag(on)); }
  Options& num_samples(uint64_t n) { return set("num_samples", std::to_string(n)); }
  Options& weights(const std::vector<double>& weights) { return set("weights", list(weights)); }
  Options& subset(const std::vector<std::size_t>& indices) { return set("subset", list(indices)); }
  Options& indices(const std::vector<std::size_t>& indices) { return set("indices", list(indices)); }
  Options& transform(std::string_view spec) { return set("transform", spec); }
  Options& dtype(std::string_view name) { return set("dtype", name); }
  Options& layout(std::string_view name) { return set("layout", name); }
  Options& input_layout(std::string_view name) { return set("input_layout", name); }
  Options& pin_memory(bool on) { return set("pin_memory", flag(on)); }
  // A CUDA device fails at Loader construction with UNSUPPORTED (saying why) when there is no
  // driver or no such device.
  Options& device(std::string_view name) { return set("device", name); }
  // The CUstream (cudaStream_t) to queue the host-to-device copies on, borrowed: it must outlive
  // the loader and every batch.
  Options& cuda_stream(void* stream) {
    return set("cuda_stream", std::to_string(reinterpret_cast<std::uintptr_t>(stream)));
  }
  // With a CUDA device, image fields cross as uint8 and are cast to the float output there (on by
  // default where the transform allows; true insists, false converts on the CPU).
  Options& gpu_normalize(bool on) { return set("gpu_normalize", flag(on)); }
  // With a CUDA device, the share (0 to 1, by a hash of the index) of samples whose JPEGs the
  // device decodes (nvJPEG); jpeg_decoder("gpu") decodes all it can.
  Options& gpu_decode_share(double share) { return set("gpu_decode_share", number(share)); }
  Options& on_error(std::string_view policy) { return set("on_error", policy); }
  Options& timeout_ms(uint64_t ms) { return set("timeout_ms", std::to_string(ms)); }
  // A string from `Loader::save_state()`.
  Options& resume_state(std::string_view state) { return set("resume_state", state); }
  Options& pad(double value) { return set("pad", number(value)); }
  // "pad" (padded, with NAME_lengths) or "offsets" (flat, with NAME_offsets of batch + 1).
  Options& ragged(std::string_view layout) { return set("ragged", layout); }
  // "xyxy", "xywh" or "cxcywh": boxes named by fields(boxes=NAME) without a :FORMAT suffix.
  Options& box_format(std::string_view format) { return set("box_format", format); }
  Options& max_image_pixels(uint64_t n) { return set("max_image_pixels", std::to_string(n)); }
  Options& jpeg_decoder(std::string_view name) { return set("jpeg_decoder", name); }
  Options& memory_budget(std::string_view bytes) { return set("memory_budget", bytes); }
  Options& autotune(bool on) { return set("autotune", flag(on)); }
  Options& trace(std::string_view path) { return set("trace", path); }
  Options& shuffle_buffer(std::size_t n) { return set("shuffle_buffer", std::to_string(n)); }
  Options& order(std::string_view name) { return set("order", name); }
  Options& fields(std::string_view spec) { return set("fields", spec); }
  // A parquet: table's columns and field names: "img:image,label".
  Options& columns(std::string_view spec) { return set("columns", spec); }
  // Its decompressed pages kept for the reading threads: "4GiB", "0" for none.
  Options& parquet_cache(std::string_view bytes) { return set("parquet_cache", bytes); }
  Options& shard_prefetch(std::size_t n) { return set("shard_prefetch", std::to_string(n)); }
  Options& cache_dir(std::string_view path) { return set("cache_dir", path); }
  Options& cache_limit(std::string_view bytes) { return set("cache_limit", bytes); }
  // Token streams (megatron:PREFIX, tokens:PATTERN, parquet:PATTERN, or a blend of them); see
  // docs/llm.md.
  Options& blend(std::string_view spec) { return set("blend", spec); }
  Options& seq_len(std::size_t n) { return set("seq_len", std::to_string(n)); }
  Options& global_batch_size(std::size_t n) { return set("global_batch_size", std::to_string(n)); }
  Options& document_boundaries(std::string_view rule) { return set("document_boundaries", rule); }
  Options& token_output_dtype(std::string_view name) { return set("token_output_dtype", name); }
  Options& token_dtype(std::string_view name) { return set("token_dtype", name); }
  Options& eos_token(uint64_t id) { return set("eos_token", std::to_string(id)); }
  Options& vocab_size(uint64_t n) { return set("vocab_size", std::to_string(n)); }
  Options& token_packing(std::string_view packing) { return set("token_packing", packing); }
  Options& pad_token(uint64_t id) { return set("pad_token", std::to_string(id)); }
  Options& allow_config_change(bool on) { return set("allow_config_change", flag(on)); }
  Options& tokenizer(std::string_view path) { return set("tokenizer", path); }
  Options& text_column(std::string_view name) { return set("text_column", name); }

  const ffi::OptionsHandle& handle() const noexcept { return *handle_; }

 private:
  static const char* flag(bool on) noexcept { return on ? "true" : "false"; }
  // Shortest decimal form that reads back as the same double (what the option parser reads).
  static std::string number(double x) {
    char buf[32];
    auto end = std::to_chars(buf, buf + sizeof buf, x).ptr;
    return std::string(buf, end);
  }
  static std::string number(std::size_t n) { return std::to_string(n); }
  template <typename T>
  static std::string list(const std::vector<T>& values) {
    std::string out;
    for (const T& v : values) {
      if (!out.empty()) out += ',';
      out += number(v);
    }
    return out;
  }
  rust::Box<ffi::OptionsHandle> handle_;
};

// One field of a batch: a C-contiguous tensor in the batch's memory. Its `data` pointer stays
// valid as long as the Batch it came from (or any shared owner of it) is alive. For a batch of a
// `device("cuda")` loader `data` is a device pointer (device_type 2, device_id the ordinal): do
// not dereference it on the CPU.
struct TensorView {
  std::string name;
  void* data = nullptr;
  DType dtype = DType::U8;
  int32_t device_type = 1;  // DLPack codes: 1 CPU, 2 CUDA, 3 CUDA host (page-locked)
  int32_t device_id = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements

  std::size_t ndim() const noexcept { return shape.size(); }
  int64_t numel() const noexcept {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::size_t nbytes() const noexcept { return static_cast<std::size_t>(numel()) * dtype_size(dtype); }
  // The data as `T*`; the caller picks T to match `dtype`.
  template <class T>
  T* data_as() const noexcept {
    return static_cast<T*>(data);
  }
};

// A batch: named tensors in one block of loader memory, held as a lease. Movable, not copyable;
// the memory returns to the loader's arena when the Batch is destroyed (or `release()`d), and a
// Batch may outlive the Loader that made it. A moved-from Batch is empty.
class Batch {
 public:
  explicit Batch(rust::Box<ffi::BatchHandle> handle) : handle_(std::move(handle)) {
    for (auto& f : (*handle_)->fields()) {
      TensorView v;
      v.name = std::string(f.name);
      v.data = reinterpret_cast<void*>(f.data);
      v.dtype = static_cast<DType>(f.dtype);
      v.device_type = f.device_type;
      v.device_id = f.device_id;
      v.shape.assign(f.shape.begin(), f.shape.end());
      v.strides.assign(f.strides.begin(), f.strides.end());
      fields_.push_back(std::move(v));
    }
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  Batch(Batch&& other) noexcept
      : handle_(std::exchange(other.handle_, std::nullopt)), fields_(std::move(other.fields_)) {
    other.fields_.clear();
  }
  Batch& operator=(Batch&& other) noexcept {
    if (this != &other) {
      handle_ = std::exchange(other.handle_, std::nullopt);
      fields_ = std::move(other.fields_);
      other.fields_.clear();
    }
    return *this;
  }
  ~Batch() = default;

  // False for a moved-from or released batch.
  bool valid() const noexcept { return handle_.has_value(); }
  explicit operator bool() const noexcept { return valid(); }

  // Returns the memory now; the batch becomes empty.
  void release() noexcept {
    handle_.reset();
    fields_.clear();
  }

  std::size_t num_fields() const noexcept { return fields_.size(); }
  const std::vector<TensorView>& fields() const noexcept { return fields_; }

  // Field `i`; throws INVALID_ARGUMENT when out of range.
  const TensorView& field(std::size_t i) const {
    if (i >= fields_.size()) {
      throw Error(Status::InvalidArgument, "field index " + std::to_string(i) + " out of range (batch has " +
                                               std::to_string(fields_.size()) + " fields)");
    }
    return fields_[i];
  }

  // The field called `name` ("data", "label", "image"); throws INVALID_ARGUMENT when absent.
  const TensorView& field(std::string_view name) const {
    for (const auto& f : fields_) {
      if (f.name == name) return f;
    }
    throw Error(Status::InvalidArgument, "no field `" + std::string(name) + "` in this batch");
  }

  // Samples in the batch (the leading dimension of every field); 0 when empty.
  std::size_t size() const noexcept { return valid() ? (*handle_)->len() : 0; }
  // The epoch the batch belongs to, and its position within it in sampler order.
  uint64_t epoch() const noexcept { return valid() ? (*handle_)->epoch() : 0; }
  std::size_t position() const noexcept { return valid() ? (*handle_)->position() : 0; }

  // --- device batches (a `device("cuda")` loader); for host batches these are no-ops ---

  // True when the fields are in CUDA device memory.
  bool is_cuda() const noexcept { return cuda_event() != nullptr; }
  // The CUstream the batch was copied on, and the CUevent that completes when every field is on
  // the device; valid while the batch lives. nullptr for a host (or empty) batch (the stream is
  // also nullptr for a device batch copied on the legacy default stream, `cuda_stream(nullptr)`).
  void* cuda_stream() const noexcept {
    return valid() ? reinterpret_cast<void*>((*handle_)->cuda_stream()) : nullptr;
  }
  void* cuda_event() const noexcept {
    return valid() ? reinterpret_cast<void*>((*handle_)->cuda_event()) : nullptr;
  }
  // Makes work queued on `cuda_stream` (a CUstream / cudaStream_t; nullptr is the legacy default
  // stream) wait for the batch's copy, without blocking the CPU, and keeps the batch's buffer
  // from being reused before the work queued there by the time the batch is released. Call it
  // with every stream that reads the batch, before queuing that work (with LibTorch:
  // `batch.wait(at::cuda::getCurrentCUDAStream().stream())`). Throws CUDA when the copy failed.
  // No-op for a host batch.
  void wait(void* cuda_stream) const {
    if (valid()) detail::call([&] { (*handle_)->wait(reinterpret_cast<std::uintptr_t>(cuda_stream)); });
  }
  // Blocks the calling thread until the copy has completed; throws CUDA when it failed. No-op for
  // a host batch.
  void synchronize() const {
    if (valid()) detail::call([&] { (*handle_)->synchronize(); });
  }

 private:
  std::optional<rust::Box<ffi::BatchHandle>> handle_;
  std::vector<TensorView> fields_;
};

// A snapshot of a loader's counters: the fields of `stoker_stats` (include/stoker.h documents
// each), declared once by the cxx bridge, plus `worker_busy_ns` (each worker's busy time, by
// worker number; `stoker_loader_worker_busy_ns` in C).
using Stats = ffi::StatsInfo;

class Loader;

// The rest of the current epoch as an input range: `for (auto& batch : loader.epoch())`.
// Each batch is owned by the iterator until the next step; move it out to keep it.
class EpochRange {
 public:
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    iterator() = default;
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    iterator& operator++();
    bool operator==(const iterator& other) const noexcept {
      return !current_.has_value() && !other.current_.has_value();
    }
    bool operator!=(const iterator& other) const noexcept { return !(*this == other); }

   private:
    friend class EpochRange;
    explicit iterator(Loader* loader);
    Loader* loader_ = nullptr;
    std::optional<Batch> current_;
  };

  iterator begin() { return iterator(loader_); }
  iterator end() { return iterator(); }

 private:
  friend class Loader;
  explicit EpochRange(Loader* loader) : loader_(loader) {}
  Loader* loader_;
};

// The loader: worker threads, prefetch, epochs. Driven by one thread at a time (stats() may be
// read from any thread); destroying it stops and joins its threads (batches already handed out
// stay valid).
class Loader {
 public:
  // Throws `stoker::Error`: INVALID_ARGUMENT (missing source, bad combination), IO (missing file),
  // DECODE (malformed file), UNSUPPORTED, ...
  explicit Loader(const Options& options)
      : handle_(detail::call([&] { return ffi::loader_new(options.handle()); })),
        stats_((*handle_)->stats_reader()),
        closer_((*handle_)->closer()) {}
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;
  // Movable; a moved-from Loader throws CLOSED from every call.
  Loader(Loader&& other) noexcept
      : handle_(std::exchange(other.handle_, std::nullopt)),
        stats_(std::exchange(other.stats_, std::nullopt)),
        closer_(std::exchange(other.closer_, std::nullopt)) {}
  Loader& operator=(Loader&& other) noexcept {
    if (this != &other) {
      handle_ = std::exchange(other.handle_, std::nullopt);
      stats_ = std::exchange(other.stats_, std::nullopt);
      closer_ = std::exchange(other.closer_, std::nullopt);
    }
    return *this;
  }

  // The next batch of the current epoch, or std::nullopt once the epoch is over; the call after
  // that starts the next epoch. A failed batch throws and is consumed: the next call moves past it.
  // With `device("cuda")` the batch is in device memory and its copy may still be running (see
  // Batch::wait); holding every device buffer (prefetch_factor + 1 batches) makes this throw
  // INVALID_ARGUMENT at once instead of waiting forever: release a batch first.
  std::optional<Batch> next() {
    rust::Box<ffi::BatchHandle> b = detail::call([&] { return h().next(); });
    if (b->is_end()) return std::nullopt;
    return Batch(std::move(b));
  }

  // The rest of the current epoch, as a range.
  EpochRange epoch() { return EpochRange(this); }

  // The epoch the next batch belongs to; it advances when next() reports the end of one.
  uint64_t current_epoch() const { return h().epoch(); }
  // The same on every rank; -1 when unknown (an iterable source without num_samples).
  int64_t batches_per_epoch() const { return h().batches_per_epoch(); }

  // Where the job is, for `Options::resume_state` of a new loader: the same string on every rank
  // that delivered the same number of batches, resumable at any world size.
  std::string save_state() const { return std::string(h().save_state()); }

  // Makes the next batch the first of `epoch` (the DistributedSampler.set_epoch habit); batches
  // being built or copied ahead are discarded, batches you hold stay valid. A no-op at the start
  // of `epoch`, or right after resuming into it.
  void set_epoch(uint64_t epoch) {
    detail::call([&] { h().set_epoch(epoch); });
  }

  // Closes the loader from any thread: a next() waiting for a batch in another thread throws
  // CLOSED at once, and so does every later call (stats() still answers). The threads are joined
  // when the loader is destroyed, by the thread that drives it. With num_workers(0) the waiting
  // thread builds the batch itself, so the close takes effect when that build returns.
  void close() const {
    if (closer_) (*closer_)->close();
  }

  // May be called from any thread, also while another thread is in next(). Throws UNSUPPORTED
  // in a child process forked after the loader was made.
  Stats stats() const {
    if (!stats_) throw Error(Status::Closed, "this stoker::Loader was moved from");
    return detail::call([&] { return (*stats_)->snapshot(); });
  }

 private:
  ffi::LoaderHandle& h() {
    if (!handle_) throw Error(Status::Closed, "this stoker::Loader was moved from");
    return **handle_;
  }
  const ffi::LoaderHandle& h() const {
    if (!handle_) throw Error(Status::Closed, "this stoker::Loader was moved from");
    return **handle_;
  }
  std::optional<rust::Box<ffi::LoaderHandle>> handle_;
  std::optional<rust::Box<ffi::StatsReader>> stats_;
  std::optional<rust::Box<ffi::LoaderCloser>> closer_;
};

inline EpochRange::iterator::iterator(Loader* loader) : loader_(loader), current_(loader->next()) {}

inline EpochRange::iterator& EpochRange::iterator::operator++() {
  current_.reset();  // release the previous batch before waiting for the next
  current_ = loader_->next();
  return *this;
}

}  // namespace stoker
