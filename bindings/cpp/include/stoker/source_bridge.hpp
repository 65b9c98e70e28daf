// Internal: the C++ half of the custom-source bridge, included by the cxx-generated header.
// Users implement `stoker::Source` (stoker.hpp) instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "rust/cxx.h"

namespace stoker {
class Source;
class IterableSource;
class SampleStream;
namespace ffi {

struct SampleHandle;  // a Rust type: the sample being filled (defined by the generated header)
struct StreamInfoC;   // shared structs (defined by the generated header)
struct SavedState;

// Owns the user's Source; called by worker threads through the bridge.
class SourceBridge {
 public:
  explicit SourceBridge(std::shared_ptr<const Source> source) : source_(std::move(source)) {}
  std::size_t size() const;
  // Exceptions thrown by Source::get propagate to Rust as the sample's error.
  void get(std::size_t index, SampleHandle& sample) const;

 private:
  std::shared_ptr<const Source> source_;
};


// Owns one open stream of an IterableSource; called by one thread at a time.
class StreamBridge {
 public:
  explicit StreamBridge(std::unique_ptr<SampleStream> stream);
  ~StreamBridge();
  // Exceptions thrown by SampleStream::next propagate to Rust as the sample's error.
  bool next(SampleHandle& sample);
  SavedState save_state();

 private:
  std::unique_ptr<SampleStream> stream_;
};

// Owns the user's IterableSource.
class IterableBridge {
 public:
  explicit IterableBridge(std::shared_ptr<const IterableSource> source) : source_(std::move(source)) {}
  std::unique_ptr<StreamBridge> open(const StreamInfoC& info, rust::Slice<const uint8_t> resume,
                                     bool has_resume) const;
  bool saves_state() const;

 private:
  std::shared_ptr<const IterableSource> source_;
};

}  // namespace ffi
}  // namespace stoker
