// Compiled into libstoker_cxx.a by build.rs: forwards the bridge's calls to the user's Source.
#include "stoker/stoker.hpp"

namespace stoker {
namespace ffi {

std::size_t SourceBridge::size() const { return static_cast<std::size_t>(source_->size()); }

void SourceBridge::get(std::size_t index, SampleHandle& sample) const {
  Sample out(sample);
  source_->get(static_cast<uint64_t>(index), out);
}

}  // namespace ffi
}  // namespace stoker
