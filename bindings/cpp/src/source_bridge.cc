// Compiled into libstoker_cxx.a by build.rs: forwards the bridge's calls to the user's Source.
#include <exception>
#include <stdexcept>

#include "stoker/stoker.hpp"

namespace stoker {
namespace ffi {

std::size_t SourceBridge::size() const {
  try {
    return static_cast<std::size_t>(source_->size());
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    throw std::runtime_error("stoker::Source::size threw an exception not derived from std::exception");
  }
}

// cxx turns a std::exception into the Rust call's Err; anything else is wrapped here so that it
// cannot reach the bridge's noexcept boundary (which would terminate the process).
void SourceBridge::get(std::size_t index, SampleHandle& sample) const {
  Sample out(sample);
  try {
    source_->get(static_cast<uint64_t>(index), out);
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    throw std::runtime_error("stoker::Source::get threw an exception not derived from std::exception");
  }
}

}  // namespace ffi
}  // namespace stoker
