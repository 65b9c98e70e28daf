// Internal: the C++ half of the custom-source bridge, included by the cxx-generated header.
// Users implement `stoker::Source` (stoker.hpp) instead.
#pragma once

#include <cstddef>
#include <memory>

namespace stoker {
class Source;
namespace ffi {

struct SampleHandle;  // a Rust type: the sample being filled (defined by the generated header)

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

}  // namespace ffi
}  // namespace stoker
