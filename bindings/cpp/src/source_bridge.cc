// Compiled into libstoker_cxx.a by build.rs: forwards the bridge's calls to the user's Source.
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

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


StreamBridge::StreamBridge(std::unique_ptr<SampleStream> stream) : stream_(std::move(stream)) {}

StreamBridge::~StreamBridge() = default;

bool StreamBridge::next(SampleHandle& sample) {
  Sample out(sample);
  try {
    return stream_->next(out);
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    throw std::runtime_error("stoker::SampleStream::next threw an exception not derived from std::exception");
  }
}

SavedState StreamBridge::save_state() {
  std::optional<std::string> state;
  try {
    state = stream_->save_state();
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    throw std::runtime_error("stoker::SampleStream::save_state threw an exception not derived from std::exception");
  }
  SavedState out;
  out.has_state = state.has_value();
  if (state) out.state = rust::String(*state);
  return out;
}

std::unique_ptr<StreamBridge> IterableBridge::open(const StreamInfoC& info, rust::Slice<const uint8_t> resume,
                                                   bool has_resume) const {
  StreamInfo i{info.rank, info.world_size, info.worker, info.num_workers, info.seed, info.epoch};
  std::string state(reinterpret_cast<const char*>(resume.data()), resume.size());
  std::unique_ptr<SampleStream> stream;
  try {
    stream = source_->open(i, has_resume ? &state : nullptr);
  } catch (const std::exception&) {
    throw;
  } catch (...) {
    throw std::runtime_error("stoker::IterableSource::open threw an exception not derived from std::exception");
  }
  if (!stream) return nullptr;
  return std::make_unique<StreamBridge>(std::move(stream));
}

bool IterableBridge::saves_state() const { return source_->saves_state(); }

}  // namespace ffi
}  // namespace stoker
