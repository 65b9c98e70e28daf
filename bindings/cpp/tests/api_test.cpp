// GoogleTest suite of stoker's C++ API (stoker/stoker.hpp), C++17.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <memory>
#include <stdexcept>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <stoker/stoker.hpp>

// The C header, only for its constants: the C++ face's codes are checked against them below.
#include "../../../include/stoker.h"

#include "npy.hpp"

namespace {

// The C++ enums restate the C ABI's codes; these keep them equal, at compile time.
#define STOKER_SAME(cxx, c) static_assert(static_cast<int64_t>(cxx) == static_cast<int64_t>(c), #cxx)
STOKER_SAME(stoker::Status::Ok, STOKER_OK);
STOKER_SAME(stoker::Status::EndOfEpoch, STOKER_END_OF_EPOCH);
STOKER_SAME(stoker::Status::InvalidArgument, STOKER_ERR_INVALID_ARGUMENT);
STOKER_SAME(stoker::Status::Io, STOKER_ERR_IO);
STOKER_SAME(stoker::Status::Decode, STOKER_ERR_DECODE);
STOKER_SAME(stoker::Status::Unsupported, STOKER_ERR_UNSUPPORTED);
STOKER_SAME(stoker::Status::Timeout, STOKER_ERR_TIMEOUT);
STOKER_SAME(stoker::Status::Callback, STOKER_ERR_CALLBACK);
STOKER_SAME(stoker::Status::Closed, STOKER_ERR_CLOSED);
STOKER_SAME(stoker::Status::Internal, STOKER_ERR_INTERNAL);
STOKER_SAME(stoker::Status::OutOfMemory, STOKER_ERR_OUT_OF_MEMORY);
STOKER_SAME(stoker::Status::Cuda, STOKER_ERR_CUDA);
STOKER_SAME(stoker::DType::U8, STOKER_DTYPE_U8);
STOKER_SAME(stoker::DType::I32, STOKER_DTYPE_I32);
STOKER_SAME(stoker::DType::I64, STOKER_DTYPE_I64);
STOKER_SAME(stoker::DType::F16, STOKER_DTYPE_F16);
STOKER_SAME(stoker::DType::BF16, STOKER_DTYPE_BF16);
STOKER_SAME(stoker::DType::F32, STOKER_DTYPE_F32);
STOKER_SAME(stoker::DType::U16, STOKER_DTYPE_U16);
#undef STOKER_SAME

static_assert(!std::is_copy_constructible_v<stoker::Batch>, "Batch is a lease: not copyable");
static_assert(std::is_nothrow_move_constructible_v<stoker::Batch>, "Batch moves");
static_assert(std::is_base_of_v<std::runtime_error, stoker::Error>, "Error is a runtime_error");

constexpr int64_t kRows = 50;
constexpr int64_t kCols = 6;

// data.npy: int32 [kRows, kCols], row i = {i*1000 + j}; labels.npy: int64 [kRows], label i = 7*i.
class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = ::testing::TempDir() + "stoker_cxx_" + info->name() + "_";
    std::vector<int32_t> data(static_cast<std::size_t>(kRows * kCols));
    std::vector<int64_t> labels(static_cast<std::size_t>(kRows));
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < kCols; ++j) data[static_cast<std::size_t>(i * kCols + j)] = static_cast<int32_t>(i * 1000 + j);
      labels[static_cast<std::size_t>(i)] = 7 * i;
    }
    stoker_test::write_npy(data_path(), "<i4", {kRows, kCols}, data);
    stoker_test::write_npy(labels_path(), "<i8", {kRows}, labels);
  }

  std::string data_path() const { return dir_ + "data.npy"; }
  std::string labels_path() const { return dir_ + "labels.npy"; }

  stoker::Options options(std::size_t batch_size = 8) const {
    return stoker::Options()
        .source("npy:" + data_path())
        .labels("npy:" + labels_path())
        .batch_size(batch_size)
        .num_workers(2);
  }

  // The sample indices of a batch, checking every row against its label.
  static std::vector<int64_t> indices(const stoker::Batch& batch) {
    const stoker::TensorView& data = batch.field("data");
    const stoker::TensorView& label = batch.field("label");
    std::vector<int64_t> out;
    for (int64_t r = 0; r < data.shape[0]; ++r) {
      const int32_t* row = data.data_as<int32_t>() + r * kCols;
      const int64_t i = row[0] / 1000;
      for (int64_t j = 0; j < kCols; ++j) EXPECT_EQ(row[j], i * 1000 + j);
      EXPECT_EQ(label.data_as<int64_t>()[r], 7 * i);
      out.push_back(i);
    }
    return out;
  }

  std::string dir_;
};

// Every typed setter, one per option key (a Rust test checks they cover exactly the keys), with
// a value the key takes: each converts to the string the parser reads.
TEST(Options, EveryTypedSetterTakesAValueOfItsKey) {
  int stream = 0;
  EXPECT_NO_THROW(stoker::Options()
                      .source("npy:x.npy")
                      .labels("npy:y.npy")
                      .batch_size(64)
                      .shuffle(true)
                      .seed(UINT64_MAX)
                      .drop_last(true)
                      .num_workers(2)
                      .num_workers_auto()
                      .prefetch_factor(4)
                      .in_order(false)
                      .rank(0)
                      .world_size(1)
                      .shard_drop_last(true)
                      .replacement(true)
                      .num_samples(1000)
                      .weights({0.1, 2.5, 1e-300})
                      .subset({3, 5, 9})
                      .indices({9, 3, 0})
                      .transform("random_resized_crop(224) | hflip")
                      .dtype("float32")
                      .layout("nhwc")
                      .input_layout("chw")
                      .pin_memory(false)
                      .device("cpu")
                      .cuda_stream(&stream)
                      .on_error("skip")
                      .timeout_ms(1000)
                      .resume_state("stoker-state-v1;seed=3;epoch=1;position=2;ahead=4;batches=6")
                      .pad(-0.5)
                      .max_image_pixels(1000000)
                      .jpeg_decoder("zune")
                      .memory_budget("8GiB")
                      .autotune(true)
                      .trace("trace.json")
                      .shuffle_buffer(100)
                      .order("quasi_random")
                      .fields("jpg;png:image,cls:label")
                      .shard_prefetch(4)
                      .cache_dir("cache")
                      .cache_limit("500GB")
                      .parquet_cache("4GiB")
                      .blend("0.7:megatron:/data/web,0.3:tokens:/data/code-*.bin")
                      .seq_len(2048)
                      .global_batch_size(512)
                      .document_boundaries("reset")
                      .token_output_dtype("int32")
                      .token_dtype("uint16")
                      .eos_token(50256)
                      .vocab_size(50304)
                      .token_packing("pad")
                      .pad_token(50256)
                      .allow_config_change(true));
  // The values round-trip: a weight that std::to_string would print as 0.000000 stays positive,
  // and a negative one is refused by the parser, naming the key.
  try {
    stoker::Options().weights({1.0, -1e-9});
    FAIL() << "a negative weight was accepted";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("`weights`"), std::string::npos) << e.what();
  }
}

TEST(Options, UnknownKeyThrowsInvalidArgumentNamingTheKey) {
  try {
    stoker::Options().set("batch_sise", "4");
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("batch_sise"), std::string::npos) << e.what();
  }
}

TEST(Options, BadValuesThrowInvalidArgumentNamingTheKey) {
  struct Case {
    const char* key;
    const char* value;
  };
  for (const Case& c : {Case{"batch_size", "0"}, Case{"batch_size", "many"}, Case{"shuffle", "maybe"},
                        Case{"source", "csv:x"}, Case{"device", "tpu"}, Case{"resume_state", "garbage"}}) {
    try {
      stoker::Options().set(c.key, c.value);
      ADD_FAILURE() << c.key << "=" << c.value << " was accepted";
    } catch (const stoker::Error& e) {
      EXPECT_EQ(e.status(), stoker::Status::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.key), std::string::npos) << e.what();
    }
  }
}

TEST(Options, InvalidUtf8IsAnInvalidArgument) {
  try {
    stoker::Options().set(std::string("\xff\xfe", 2), "1");
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
  }
}

TEST(Options, CopiesAreIndependent) {
  stoker::Options a;
  a.batch_size(4);
  stoker::Options b = a;
  b.set("source", "npy:/nonexistent/b.npy");
  // `a` has no source: making a loader from it fails on `source`, not on b's missing file.
  try {
    stoker::Loader loader(a);
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("source"), std::string::npos) << e.what();
  }
}

TEST(Errors, MissingFileThrowsIoNamingTheFile) {
  const std::string path = ::testing::TempDir() + "stoker_cxx_no_such_file.npy";
  try {
    stoker::Loader loader(stoker::Options().source("npy:" + path));
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Io);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(Errors, MalformedFileThrowsDecode) {
  const std::string path = ::testing::TempDir() + "stoker_cxx_not_npy.npy";
  std::vector<uint8_t> junk(64, 'x');
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(junk.data()), static_cast<std::streamsize>(junk.size()));
  }
  try {
    stoker::Loader loader(stoker::Options().source("npy:" + path));
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Decode) << e.what();
  }
}

TEST(Errors, CaughtAsStdRuntimeError) {
  EXPECT_THROW(stoker::Options().set("nope", "1"), std::runtime_error);
  EXPECT_STREQ(stoker::to_string(stoker::Status::InvalidArgument), "INVALID_ARGUMENT");
  EXPECT_EQ(static_cast<int>(stoker::Status::Cuda), -10);
}

TEST_F(LoaderTest, FullEpochDeliversEverySampleOnceWithMatchingValues) {
  stoker::Loader loader(options(8).shuffle(true).seed(3));
  EXPECT_EQ(loader.batches_per_epoch(), 7);  // 50 = 6 * 8 + 2
  std::vector<int64_t> seen;
  std::size_t batches = 0;
  for (auto& batch : loader.epoch()) {
    ASSERT_EQ(batch.num_fields(), 2u);
    const stoker::TensorView& data = batch.field(0);
    EXPECT_EQ(data.name, "data");
    EXPECT_EQ(data.dtype, stoker::DType::I32);
    EXPECT_EQ(data.shape, (std::vector<int64_t>{batches < 6 ? 8 : 2, kCols}));
    EXPECT_EQ(data.strides, (std::vector<int64_t>{kCols, 1}));
    EXPECT_EQ(data.device_type, 1);
    EXPECT_EQ(batch.field(1).name, "label");
    EXPECT_EQ(batch.field(1).dtype, stoker::DType::I64);
    EXPECT_EQ(batch.field("data").data, data.data);
    EXPECT_EQ(batch.size(), static_cast<std::size_t>(data.shape[0]));
    EXPECT_EQ(batch.position(), batches);
    for (int64_t i : indices(batch)) seen.push_back(i);
    ++batches;
  }
  EXPECT_EQ(batches, 7u);
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < kRows; ++i) ASSERT_EQ(sorted[static_cast<std::size_t>(i)], i);
  std::vector<int64_t> in_order(seen.size());
  for (std::size_t i = 0; i < in_order.size(); ++i) in_order[i] = static_cast<int64_t>(i);
  EXPECT_NE(seen, in_order) << "shuffle=true left the order unchanged";
}

TEST_F(LoaderTest, EndOfEpochThenTheNextEpoch) {
  stoker::Loader loader(options(10).shuffle(true));
  EXPECT_EQ(loader.current_epoch(), 0u);
  std::vector<std::vector<int64_t>> orders(2);
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (int b = 0; b < 5; ++b) {
      std::optional<stoker::Batch> batch = loader.next();
      ASSERT_TRUE(batch.has_value()) << "epoch " << epoch << " batch " << b;
      EXPECT_EQ(batch->epoch(), static_cast<uint64_t>(epoch));
      for (int64_t i : indices(*batch)) orders[static_cast<std::size_t>(epoch)].push_back(i);
    }
    EXPECT_FALSE(loader.next().has_value()) << "no END after epoch " << epoch;
    EXPECT_EQ(loader.current_epoch(), static_cast<uint64_t>(epoch + 1));
  }
  EXPECT_NE(orders[0], orders[1]) << "each epoch has its own permutation";
}

TEST_F(LoaderTest, RangeForCoversOneEpochAndStopsAtItsEnd) {
  stoker::Loader loader(options(25));
  int n = 0;
  for (auto& batch : loader.epoch()) {
    EXPECT_TRUE(batch.valid());
    ++n;
  }
  EXPECT_EQ(n, 2);
  EXPECT_EQ(loader.current_epoch(), 1u);
  n = 0;
  for (auto& batch : loader.epoch()) n += static_cast<int>(batch.size());
  EXPECT_EQ(n, kRows);
}

TEST_F(LoaderTest, SameBatchesForAnyNumberOfWorkers) {
  auto run = [&](std::size_t workers) {
    stoker::Loader loader(options(8).shuffle(true).seed(11).num_workers(workers));
    std::vector<int64_t> order;
    for (auto& batch : loader.epoch()) {
      for (int64_t i : indices(batch)) order.push_back(i);
    }
    return order;
  };
  EXPECT_EQ(run(0), run(2));
}

TEST_F(LoaderTest, BatchesOutliveTheirLoader) {
  std::vector<stoker::Batch> kept;
  {
    stoker::Loader loader(options(8).shuffle(true));
    for (auto& batch : loader.epoch()) kept.push_back(std::move(batch));
  }  // the loader's threads are joined here; the batches still hold their memory
  ASSERT_EQ(kept.size(), 7u);
  std::set<int64_t> seen;
  for (const stoker::Batch& batch : kept) {
    ASSERT_TRUE(batch.valid());
    for (int64_t i : indices(batch)) seen.insert(i);
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kRows));
}

TEST_F(LoaderTest, MovedFromBatchIsEmptyAndReleasesOnce) {
  stoker::Loader loader(options(8));
  std::optional<stoker::Batch> first = loader.next();
  ASSERT_TRUE(first.has_value());
  const void* data = first->field("data").data;

  stoker::Batch moved(std::move(*first));
  EXPECT_FALSE(first->valid());
  EXPECT_FALSE(static_cast<bool>(*first));
  EXPECT_EQ(first->num_fields(), 0u);
  EXPECT_EQ(first->size(), 0u);
  EXPECT_THROW(first->field(0), stoker::Error);
  EXPECT_TRUE(moved.valid());
  EXPECT_EQ(moved.field("data").data, data);

  std::optional<stoker::Batch> second = loader.next();
  ASSERT_TRUE(second.has_value());
  moved = std::move(*second);  // releases the first batch, takes the second
  EXPECT_FALSE(second->valid());
  EXPECT_EQ(moved.position(), 1u);
  indices(moved);

  moved.release();
  EXPECT_FALSE(moved.valid());
  moved.release();  // releasing twice is harmless
  first.reset();    // destroying moved-from batches releases nothing
  second.reset();
  // The loader still works after all that.
  int rest = 0;
  for (auto& batch : loader.epoch()) rest += static_cast<int>(batch.valid());
  EXPECT_EQ(rest, 5);
}

TEST_F(LoaderTest, FieldLookupErrors) {
  stoker::Loader loader(options(8));
  std::optional<stoker::Batch> batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  try {
    batch->field("image");
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("image"), std::string::npos);
  }
  EXPECT_THROW(batch->field(2), stoker::Error);
}

TEST_F(LoaderTest, SaveStateAndResumeReproduceTheSequence) {
  auto opts = options(6).shuffle(true).seed(5);
  std::vector<int64_t> reference;  // epochs 0 and 1 in full
  {
    stoker::Loader loader(opts);
    for (int e = 0; e < 2; ++e) {
      for (auto& batch : loader.epoch()) {
        for (int64_t i : indices(batch)) reference.push_back(i);
      }
    }
  }
  std::vector<int64_t> resumed;
  std::string state;
  {
    stoker::Loader loader(opts);
    for (int b = 0; b < 3; ++b) {
      std::optional<stoker::Batch> batch = loader.next();
      ASSERT_TRUE(batch.has_value());
      for (int64_t i : indices(*batch)) resumed.push_back(i);
    }
    state = loader.save_state();
  }
  EXPECT_EQ(state.rfind("stoker-state-v2", 0), 0u) << state;
  {
    stoker::Options again = opts;
    stoker::Loader loader(again.resume_state(state));
    EXPECT_EQ(loader.current_epoch(), 0u);
    for (int e = 0; e < 2; ++e) {
      for (auto& batch : loader.epoch()) {
        for (int64_t i : indices(batch)) resumed.push_back(i);
      }
    }
  }
  EXPECT_EQ(resumed, reference);
}

TEST_F(LoaderTest, SetEpochStartsThatEpochAndStatsSayTheRank) {
  auto opts = options(4).shuffle(true).seed(9).set("rank", "1").set("world_size", "2");
  std::vector<int64_t> epoch3;
  {
    stoker::Loader loader(opts);
    for (int e = 0; e < 3; ++e) {
      for (auto& batch : loader.epoch()) (void)batch;
    }
    for (auto& batch : loader.epoch()) {
      for (int64_t i : indices(batch)) epoch3.push_back(i);
    }
  }
  ASSERT_EQ(epoch3.size(), 25u);  // 50 samples dealt to 2 ranks
  stoker::Loader loader(opts);
  std::optional<stoker::Batch> held = loader.next();  // work is in flight now
  ASSERT_TRUE(held.has_value());
  loader.set_epoch(3);
  EXPECT_EQ(loader.current_epoch(), 3u);
  std::vector<int64_t> got;
  for (auto& batch : loader.epoch()) {
    for (int64_t i : indices(batch)) got.push_back(i);
  }
  EXPECT_EQ(got, epoch3);
  EXPECT_EQ(indices(*held).size(), 4u);  // a held batch stays valid
  stoker::Stats s = loader.stats();
  EXPECT_EQ(s.rank, 1u);
  EXPECT_EQ(s.world_size, 2u);
  EXPECT_EQ(s.launcher, 1u);  // STOKER_LAUNCHER_EXPLICIT
  EXPECT_EQ(s.batches, 1u + 7u);
}

TEST_F(LoaderTest, ResumeStateFromADifferentLoaderIsRejected) {
  std::string state;
  {
    stoker::Loader loader(options(6));
    loader.next();
    state = loader.save_state();
  }
  try {
    stoker::Loader loader(options(7).resume_state(state));
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("resume_state"), std::string::npos) << e.what();
  }
}

TEST_F(LoaderTest, StatsCountWhatWasDelivered) {
  stoker::Loader loader(options(8));
  stoker::Stats before = loader.stats();
  EXPECT_EQ(before.batches, 0u);
  for (auto& batch : loader.epoch()) (void)batch;
  stoker::Stats s = loader.stats();
  EXPECT_EQ(s.batches, 7u);
  EXPECT_EQ(s.samples, static_cast<uint64_t>(kRows));
  EXPECT_EQ(s.samples_skipped, 0u);
  EXPECT_GT(s.elapsed_ns, 0u);
  EXPECT_LE(s.wait_ns_p50, s.wait_ns_p95);
  EXPECT_LE(s.wait_ns_p95, s.wait_ns_max);
  EXPECT_LE(s.wait_ns_max, s.wait_ns_total);
  EXPECT_GE(s.readiness, 0.0);
  EXPECT_LE(s.readiness, 1.0);
  EXPECT_GE(s.worker_busy, 0.0);
  EXPECT_LE(s.worker_busy, 1.0);
  // Where the time went: npy rows are read and collated, never decoded or transformed.
  EXPECT_GT(s.read_ns, 0u);
  EXPECT_GT(s.collate_ns, 0u);
  EXPECT_EQ(s.decode_ns + s.transform_ns + s.h2d_ns, 0u);
  EXPECT_LE(s.read_ns + s.collate_ns, s.busy_ns);
  EXPECT_LE(s.read_ns_p50, s.read_ns_p95);
  EXPECT_GT(s.read_ns_p50, 0u);
  EXPECT_EQ(s.worker_busy_ns.size(), static_cast<size_t>(s.num_workers));
  uint64_t per_worker = 0;
  for (uint64_t ns : s.worker_busy_ns) per_worker += ns;
  EXPECT_EQ(per_worker, s.busy_ns);
  // The default memory budget fits these batches: the cap is 2 workers x prefetch_factor 2.
  EXPECT_GT(s.batch_bytes, 0u);
  EXPECT_LE(s.batch_bytes, s.memory_budget);
  EXPECT_EQ(s.in_flight_cap, 4u);
  EXPECT_EQ(s.in_flight_cap_requested, 4u);
  // Within it, the loader builds workers + 1 ahead until the consumer's waits ask for more,
  // and the batch memory mapped is what those batches (and any kept for reuse) hold.
  EXPECT_GE(s.in_flight_depth, 3u);
  EXPECT_LE(s.in_flight_depth, s.in_flight_cap);
  EXPECT_GT(s.batch_memory_bytes, 0u);
  EXPECT_GE(s.batch_memory_peak_bytes, s.batch_memory_bytes);
  // Mapping the slabs touched each of their pages once: faults were taken, and counted.
  EXPECT_GT(s.page_faults, 0u);
}

TEST_F(LoaderTest, MemoryBudgetLowersTheCapOrRefusesABatchThatCannotFit) {
  const uint64_t one_batch = stoker::Loader(options(8)).stats().batch_bytes;
  try {
    stoker::Loader loader(options(8).memory_budget(std::to_string(one_batch - 1)));
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("memory_budget"), std::string::npos) << e.what();
  }
  stoker::Loader loader(options(8).memory_budget(std::to_string(2 * one_batch)));
  const stoker::Stats s = loader.stats();
  EXPECT_EQ(s.in_flight_cap, 2u);
  EXPECT_EQ(s.in_flight_cap_requested, 4u);
  std::size_t batches = 0;
  for (auto& batch : loader.epoch()) {
    (void)batch;
    ++batches;
  }
  EXPECT_EQ(batches, 7u);
}

TEST_F(LoaderTest, AutotuneAndTraceAreOptions) {
  const std::string path = ::testing::TempDir() + "stoker-cpp-trace.json";
  {
    stoker::Loader loader(options(8).autotune(true).trace(path));
    const stoker::Stats s = loader.stats();
    EXPECT_EQ(s.prefetch_factor, 2u);
    EXPECT_EQ(s.autotune_decisions, 0u);
    for (auto& batch : loader.epoch()) (void)batch;
  }  // dropping the loader writes the trace
  std::FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr);
  char head[32] = {0};
  EXPECT_GT(std::fread(head, 1, sizeof head - 1, f), 0u);
  std::fclose(f);
  EXPECT_NE(std::string(head).find("displayTimeUnit"), std::string::npos) << head;
  std::remove(path.c_str());
}

TEST_F(LoaderTest, StatsReadFromAnotherThreadWhileTraining) {
  stoker::Loader loader(options(2).num_workers(2));
  std::atomic<bool> done{false};
  uint64_t last_seen = 0;
  std::thread reader([&] {
    while (!done.load()) {
      const stoker::Stats s = loader.stats();
      EXPECT_GE(s.batches, last_seen);  // monotonic
      last_seen = s.batches;
    }
  });
  for (int e = 0; e < 3; ++e) {
    for (auto& batch : loader.epoch()) (void)batch;
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(loader.stats().batches, 75u);
}

TEST_F(LoaderTest, MovedFromLoaderThrowsClosed) {
  stoker::Loader a(options(8));
  stoker::Loader b(std::move(a));
  EXPECT_TRUE(b.next().has_value());
  EXPECT_THROW(a.stats(), stoker::Error);
  try {
    a.next();
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Closed);
  }
}

// On a machine without a GPU a CUDA loader fails at construction, saying what is missing. (With a
// driver and a device it is made; device batches are tested in Rust against the fake device:
// `cargo test -p stoker-cxx`, src/cuda_tests.rs.)
TEST_F(LoaderTest, DeviceCudaIsUnsupportedHere) {
  for (const char* device : {"cuda", "cuda:1"}) {
    try {
      stoker::Loader loader(options(8).device(device).cuda_stream(nullptr));
      GTEST_SKIP() << "this machine has a CUDA driver and device";
    } catch (const stoker::Error& e) {
      EXPECT_EQ(e.status(), stoker::Status::Unsupported) << e.what();
      const std::string what = e.what();
      // "no CUDA driver (libcuda.so) found", or "CUDA driver present but ..." (no device, too old).
      EXPECT_NE(what.find("CUDA driver"), std::string::npos) << what;
      if (what.find("no CUDA driver") != std::string::npos) {
        EXPECT_NE(what.find("libcuda"), std::string::npos) << what;
      }
    }
  }
}

TEST_F(LoaderTest, HostBatchesHaveNoCudaStreamAndWaitIsANoOp) {
  stoker::Loader loader(options(8));
  stoker::Batch batch = loader.next().value();
  EXPECT_FALSE(batch.is_cuda());
  EXPECT_EQ(batch.cuda_stream(), nullptr);
  EXPECT_EQ(batch.cuda_event(), nullptr);
  for (const auto& f : batch.fields()) {
    EXPECT_NE(f.device_type, 2) << f.name;
    EXPECT_EQ(f.device_id, 0) << f.name;
  }
  EXPECT_NO_THROW(batch.wait(nullptr));
  EXPECT_NO_THROW(batch.wait(reinterpret_cast<void*>(std::uintptr_t{0x1234})));
  EXPECT_NO_THROW(batch.synchronize());
  // Still readable afterwards: nothing was released.
  EXPECT_EQ(indices(batch).size(), 8u);

  stoker::Batch moved = std::move(batch);
  EXPECT_FALSE(batch.is_cuda());
  EXPECT_EQ(batch.cuda_stream(), nullptr);
  EXPECT_EQ(batch.cuda_event(), nullptr);
  EXPECT_NO_THROW(batch.wait(nullptr));
  EXPECT_NO_THROW(batch.synchronize());
  moved.release();
  EXPECT_EQ(moved.cuda_event(), nullptr);
  EXPECT_NO_THROW(moved.synchronize());
}

TEST_F(LoaderTest, CudaStreamOptionIsAccepted) {
  stoker::Options o = options(8);
  EXPECT_NO_THROW(o.cuda_stream(reinterpret_cast<void*>(std::uintptr_t{0x7f00aa})));
  EXPECT_NO_THROW(o.cuda_stream(nullptr));
  EXPECT_NO_THROW(o.cuda_stream(reinterpret_cast<void*>(~std::uintptr_t{0})));
  // It is the `cuda_stream` key, as a decimal address; a host loader ignores it.
  EXPECT_NO_THROW(o.set("cuda_stream", std::to_string(std::uintptr_t{0x7f00aa})));
  stoker::Loader loader(o);
  EXPECT_TRUE(loader.next().has_value());
  try {
    o.set("cuda_stream", "not a stream");
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cuda_stream"), std::string::npos) << e.what();
  }
}

// A C++ dataset: sample i is x = {i, i+0.5, i+0.25} (float32 [3]) and label 2*i; `get` throws for
// the indices in `bad`, and puts a wrong shape for `misshapen`.
class Squares : public stoker::Source {
 public:
  explicit Squares(uint64_t n, std::set<uint64_t> bad = {}, int64_t misshapen = -1)
      : n_(n), bad_(std::move(bad)), misshapen_(misshapen) {}
  uint64_t size() const override { return n_; }
  void get(uint64_t index, stoker::Sample& out) const override {
    calls.fetch_add(1);
    if (bad_.count(index)) throw std::runtime_error("cannot read record " + std::to_string(index));
    const float i = static_cast<float>(index);
    const float x[4] = {i, i + 0.5f, i + 0.25f, 0};
    const int64_t len = static_cast<int64_t>(index) == misshapen_ ? 4 : 3;
    try {
      out.put_tensor("x", stoker::DType::F32, {len}, x);
    } catch (const stoker::Error&) {
      put_errors.fetch_add(1);
      throw;
    }
    out.put_label(2 * static_cast<int64_t>(index));
  }
  mutable std::atomic<int> calls{0};
  mutable std::atomic<int> put_errors{0};

 private:
  uint64_t n_;
  std::set<uint64_t> bad_;
  int64_t misshapen_;
};

TEST(CustomSource, FeedsTheLoaderFromWorkerThreads) {
  auto source = std::make_shared<Squares>(30);
  stoker::Loader loader(stoker::Options().source(source).batch_size(8).shuffle(true).num_workers(2));
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  std::set<int64_t> seen;
  for (auto& batch : loader.epoch()) {
    ASSERT_EQ(batch.num_fields(), 2u);
    const stoker::TensorView& x = batch.field("x");
    const stoker::TensorView& label = batch.field("label");
    EXPECT_EQ(x.dtype, stoker::DType::F32);
    EXPECT_EQ(x.shape[1], 3);
    for (int64_t r = 0; r < x.shape[0]; ++r) {
      const float* row = x.data_as<float>() + r * 3;
      const int64_t i = static_cast<int64_t>(row[0]);
      EXPECT_EQ(row[1], row[0] + 0.5f);
      EXPECT_EQ(row[2], row[0] + 0.25f);
      EXPECT_EQ(label.data_as<int64_t>()[r], 2 * i);
      seen.insert(i);
    }
  }
  EXPECT_EQ(seen.size(), 30u);
  EXPECT_GE(source->calls.load(), 30);
}

// Sample 1 blocks until `release()` (at most 10 s, so a broken test fails instead of hanging).
class Stalls : public stoker::Source {
 public:
  uint64_t size() const override { return 16; }
  void get(uint64_t index, stoker::Sample& out) const override {
    if (index == 1) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return released_; });
    }
    out.put_label(static_cast<int64_t>(index));
  }
  void release() const {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool released_ = false;
};

TEST(Loader, CloseFromAnotherThreadWakesAWaitingNext) {
  auto source = std::make_shared<Stalls>();
  stoker::Loader loader(stoker::Options().source(source).batch_size(2).num_workers(2));
  const auto start = std::chrono::steady_clock::now();
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    loader.close();
  });
  try {
    loader.next();
    FAIL() << "next() returned while its batch is stalled";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Closed) << e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  closer.join();
  EXPECT_LT(waited, std::chrono::seconds(5)) << "woken by the source, not by close()";
  EXPECT_THROW(loader.next(), stoker::Error);
  EXPECT_NO_THROW(loader.stats());
  loader.close();  // twice is once
  source->release();  // the destructor joins the worker once its read returns
}

TEST(CustomSource, AnExceptionInGetBecomesACallbackErrorWithItsMessage) {
  auto source = std::make_shared<Squares>(20, std::set<uint64_t>{13});
  stoker::Loader loader(stoker::Options().source(source).batch_size(5).num_workers(2));
  int good = 0, failed = 0;
  for (int b = 0; b < 4; ++b) {
    try {
      std::optional<stoker::Batch> batch = loader.next();
      ASSERT_TRUE(batch.has_value());
      ++good;
    } catch (const stoker::Error& e) {
      ++failed;
      EXPECT_EQ(e.status(), stoker::Status::Callback) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot read record 13"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(good, 3);
  EXPECT_EQ(failed, 1);
  EXPECT_FALSE(loader.next().has_value()) << "the failed batch was consumed; the epoch ends";
}

TEST(CustomSource, FailingSampleZeroFailsTheLoaderConstruction) {
  try {
    stoker::Loader loader(stoker::Options().source(std::make_shared<Squares>(5, std::set<uint64_t>{0})));
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Callback);
    EXPECT_NE(std::string(e.what()).find("cannot read record 0"), std::string::npos) << e.what();
  }
}

class Throws : public stoker::Source {
 public:
  uint64_t size() const override { return 4; }
  void get(uint64_t index, stoker::Sample& out) const override {
    if (index == 2) throw 42;  // not a std::exception
    out.put_label(static_cast<int64_t>(index));
  }
};

TEST(CustomSource, ANonStdExceptionIsStillAnError) {
  stoker::Loader loader(stoker::Options().source(std::make_shared<Throws>()).batch_size(4).num_workers(0));
  try {
    loader.next();
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Callback);
    EXPECT_NE(std::string(e.what()).find("not derived from std::exception"), std::string::npos) << e.what();
  }
}

TEST(CustomSource, SkipReplacesBadSamplesAndCountsThem) {
  auto source = std::make_shared<Squares>(20, std::set<uint64_t>{3, 11});
  stoker::Loader loader(stoker::Options().source(source).batch_size(5).num_workers(2).on_error("skip"));
  int batches = 0;
  for (auto& batch : loader.epoch()) batches += batch.valid() ? 1 : 0;
  EXPECT_EQ(batches, 4);
  // Both bad samples; a replacement drawn bad is replaced and counted again.
  EXPECT_GE(loader.stats().samples_skipped, 2u);
  EXPECT_EQ(loader.stats().samples, 20u);
}

TEST(CustomSource, AWrongShapeIsRefusedByPutAndFailsTheSample) {
  auto source = std::make_shared<Squares>(10, std::set<uint64_t>{}, 6);
  stoker::Loader loader(stoker::Options().source(source).batch_size(5).num_workers(0));
  EXPECT_TRUE(loader.next().has_value());
  try {
    loader.next();
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Decode) << e.what();  // a malformed sample
    EXPECT_NE(std::string(e.what()).find("sample 6"), std::string::npos) << e.what();
  }
  EXPECT_EQ(source->put_errors.load(), 1);
}

TEST(Version, IsSemver) {
  const std::string v = stoker::version();
  EXPECT_EQ(std::count(v.begin(), v.end(), '.'), 2) << v;
}

}  // namespace

// Variable-length int32 sequences: sample i has i % 4 tokens, 100 * i + k.
class Ragged : public stoker::Source {
 public:
  uint64_t size() const override { return 17; }
  void get(uint64_t index, stoker::Sample& out) const override {
    std::vector<int32_t> tokens(index % 4);
    for (std::size_t k = 0; k < tokens.size(); ++k) tokens[k] = static_cast<int32_t>(100 * index + k);
    out.put_tensor("tokens", stoker::DType::I32, {static_cast<int64_t>(tokens.size())}, tokens.data());
    out.put_label(static_cast<int64_t>(index));
  }
};

TEST(CustomSource, RaggedTensorsArePaddedWithLengths) {
  stoker::Loader loader(stoker::Options().source(std::make_shared<Ragged>()).batch_size(5).set("pad", "-1")
                            .shuffle(true).num_workers(2));
  std::set<int64_t> seen;
  for (auto& batch : loader.epoch()) {
    ASSERT_EQ(batch.num_fields(), 3u);
    const stoker::TensorView& tokens = batch.field("tokens");
    const stoker::TensorView& labels = batch.field("label");
    const stoker::TensorView& lengths = batch.field("tokens_lengths");
    int64_t longest = 0;
    for (int64_t r = 0; r < tokens.shape[0]; ++r) {
      const int64_t i = labels.data_as<int64_t>()[r], n = lengths.data_as<int64_t>()[r];
      EXPECT_EQ(n, i % 4);
      longest = std::max(longest, n);
      const int32_t* row = tokens.data_as<int32_t>() + r * tokens.shape[1];
      for (int64_t k = 0; k < tokens.shape[1]; ++k) EXPECT_EQ(row[k], k < n ? 100 * i + k : -1);
      seen.insert(i);
    }
    EXPECT_EQ(tokens.shape[1], longest);  // padded to this batch's longest
  }
  EXPECT_EQ(seen.size(), 17u);
}

TEST(CustomSource, RaggedTensorsUnderOffsetsLieEndToEndWithOffsets) {
  stoker::Loader loader(stoker::Options().source(std::make_shared<Ragged>()).batch_size(5).ragged("offsets")
                            .shuffle(true).num_workers(2));
  std::set<int64_t> seen;
  for (auto& batch : loader.epoch()) {
    ASSERT_EQ(batch.num_fields(), 3u);
    const stoker::TensorView& tokens = batch.field("tokens");
    const stoker::TensorView& labels = batch.field("label");
    const stoker::TensorView& offsets = batch.field("tokens_offsets");
    ASSERT_EQ(offsets.shape[0], labels.shape[0] + 1);
    const int64_t* at = offsets.data_as<int64_t>();
    EXPECT_EQ(at[0], 0);
    for (int64_t r = 0; r < labels.shape[0]; ++r) {
      const int64_t i = labels.data_as<int64_t>()[r];
      ASSERT_EQ(at[r + 1] - at[r], i % 4);
      for (int64_t k = 0; k < i % 4; ++k) EXPECT_EQ(tokens.data_as<int32_t>()[at[r] + k], 100 * i + k);
      seen.insert(i);
    }
    EXPECT_EQ(tokens.shape[0], at[labels.shape[0]]);  // no padding: exactly the rows of the batch
  }
  EXPECT_EQ(seen.size(), 17u);
}

TEST(CustomSource, SameBatchesForAnyNumberOfWorkers) {
  auto labels_of = [](int workers) {
    stoker::Loader loader(stoker::Options().source(std::make_shared<Ragged>()).batch_size(4).set("pad", "0")
                              .shuffle(true).seed(11).num_workers(workers));
    std::vector<int64_t> out;
    for (int epoch = 0; epoch < 2; ++epoch)
      for (auto& batch : loader.epoch()) {
        const stoker::TensorView& l = batch.field("label");
        out.insert(out.end(), l.data_as<int64_t>(), l.data_as<int64_t>() + l.shape[0]);
      }
    return out;
  };
  const std::vector<int64_t> reference = labels_of(0);
  EXPECT_EQ(labels_of(1), reference);
  EXPECT_EQ(labels_of(2), reference);
}

// The same JPEG files through a Source and through image_folder.
class JpegFiles : public stoker::Source {
 public:
  explicit JpegFiles(std::vector<std::filesystem::path> paths) : paths_(std::move(paths)) {}
  uint64_t size() const override { return paths_.size(); }
  void get(uint64_t index, stoker::Sample& out) const override {
    std::ifstream in(paths_[index], std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    out.put_encoded(bytes.data(), bytes.size());
    out.put_label(paths_[index].parent_path().filename() == "b" ? 1 : 0);
  }

 private:
  std::vector<std::filesystem::path> paths_;
};

TEST(CustomSource, EncodedJpegsGiveThePixelsOfImageFolder) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("stoker-cxx-jpegs-" + std::to_string(::getpid()));
  fs::remove_all(root);
  // image_folder's order: class folders sorted, then file names sorted.
  std::vector<fs::path> paths = {root / "a" / "photo_baseline.jpg", root / "a" / "photo_gray.jpg",
                                 root / "b" / "photo_cmyk.jpg", root / "b" / "photo_progressive.jpg"};
  for (const fs::path& p : paths) {
    fs::create_directories(p.parent_path());
    fs::copy_file(fs::path(STOKER_IMAGE_FIXTURES) / p.filename(), p);
  }
  auto options = [] {
    return stoker::Options().transform("random_resized_crop(40) | hflip | normalize(imagenet)").batch_size(2)
        .shuffle(true).seed(3).num_workers(2);
  };
  stoker::Loader direct(options().source("image_folder:" + root.string()));
  stoker::Loader through(options().source(std::make_shared<JpegFiles>(paths)));
  int batches = 0;
  while (std::optional<stoker::Batch> a = direct.next()) {
    std::optional<stoker::Batch> b = through.next();
    ASSERT_TRUE(b.has_value());
    for (const char* name : {"image", "label"}) {
      const stoker::TensorView& x = a->field(name);
      const stoker::TensorView& y = b->field(name);
      ASSERT_EQ(x.shape, y.shape);
      EXPECT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << name;
    }
    ++batches;
  }
  EXPECT_EQ(batches, 2);
  fs::remove_all(root);
}

// A token stream from C++: a flat uint16 file cut into windows of seq_len + 1 tokens (input_ids,
// labels the inputs shifted by one), and global batches whose union over 2 ranks is one process's.
TEST(Tokens, FlatFileWindowsAndGlobalBatchesAtTwoRanks) {
  const std::string path = ::testing::TempDir() + "stoker_cxx_tokens.bin";
  auto token = [](int64_t k) { return static_cast<uint16_t>((k * 13 + 5) % 50000); };
  {
    std::vector<uint16_t> tokens(401);  // 25 windows of 16 (+1)
    for (std::size_t k = 0; k < tokens.size(); ++k) tokens[k] = token(static_cast<int64_t>(k));
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
  }
  auto options = [&](std::size_t batch) {
    return stoker::Options().source("tokens:" + path).token_dtype("uint16").seq_len(16).batch_size(batch)
        .global_batch_size(8).shuffle(true).seed(4);
  };
  // Every delivered window is the tokens of its first input id's place in the stream.
  std::vector<int64_t> whole;
  stoker::Loader one(options(8).rank(0).world_size(1));
  for (auto& batch : one.epoch()) {
    const stoker::TensorView& ids = batch.field("input_ids");
    const stoker::TensorView& labels = batch.field("labels");
    ASSERT_EQ(ids.shape[1], 16);
    for (int64_t r = 0; r < ids.shape[0]; ++r) {
      int64_t sample = -1;
      for (int64_t i = 0; i < 25 && sample < 0; ++i)
        if (token(16 * i) == ids.data_as<int64_t>()[r * 16]) sample = i;
      ASSERT_GE(sample, 0);
      for (int64_t k = 0; k < 16; ++k) {
        EXPECT_EQ(ids.data_as<int64_t>()[r * 16 + k], token(16 * sample + k));
        EXPECT_EQ(labels.data_as<int64_t>()[r * 16 + k], token(16 * sample + k + 1));
      }
      whole.push_back(sample);
    }
  }
  EXPECT_EQ(whole.size(), 24u);  // three whole global batches of 8; the tail of 1 is not delivered
  // Two ranks, micro-batches of 2: step s is rank 0's 4 samples, then rank 1's.
  stoker::Loader r0(options(2).rank(0).world_size(2)), r1(options(2).rank(1).world_size(2));
  std::vector<int64_t> ranks;
  auto take = [&](stoker::Loader& loader) {
    for (int got = 0; got < 4;) {
      auto batch = loader.next();
      ASSERT_TRUE(batch.has_value());
      const stoker::TensorView& ids = batch->field("input_ids");
      for (int64_t r = 0; r < ids.shape[0]; ++r, ++got)
        for (int64_t i = 0; i < 25; ++i)
          if (token(16 * i) == ids.data_as<int64_t>()[r * 16]) ranks.push_back(i);
    }
  };
  for (int step = 0; step < 3; ++step) {
    take(r0);
    take(r1);
  }
  EXPECT_EQ(ranks, whole);
  std::remove(path.c_str());
}

// stoker::pack: the same photographs packed (kept, raw, in two merged slices) give the batches of
// their image folder; a bad mode throws INVALID_ARGUMENT naming it.
TEST(Pack, PackedPhotographsGiveTheBatchesOfTheirFolder) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("stoker-cxx-pack-" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const char* name : {"photo_baseline.jpg", "photo_gray.jpg", "photo_cmyk.jpg", "photo_progressive.jpg"}) {
    fs::create_directories(root / "images" / "a");
    fs::copy_file(fs::path(STOKER_IMAGE_FIXTURES) / name, root / "images" / "a" / name);
  }
  const std::string folder = "image_folder:" + (root / "images").string();
  stoker::pack(folder, (root / "kept.stkpack").string());
  stoker::PackOptions raw;
  raw.mode = "raw";
  stoker::pack(folder, (root / "raw.stkpack").string(), raw);
  for (uint32_t i = 0; i < 2; ++i) {
    stoker::PackOptions slice;
    slice.shard_index = i;
    slice.num_shards = 2;
    stoker::pack(folder, (root / "sliced").string(), slice);
  }
  stoker::pack_merge((root / "sliced").string());

  auto first_images = [](const std::string& source) {
    stoker::Loader loader(stoker::Options().source(source).transform("random_resized_crop(40) | hflip | normalize(imagenet)")
                              .batch_size(4).shuffle(true).seed(5).num_workers(2));
    std::optional<stoker::Batch> batch = loader.next();
    EXPECT_TRUE(batch.has_value());
    const stoker::TensorView& x = batch->field("image");
    const auto* p = static_cast<const uint8_t*>(x.data);
    return std::vector<uint8_t>(p, p + x.nbytes());
  };
  const std::vector<uint8_t> want = first_images(folder);
  EXPECT_EQ(first_images("packed:" + (root / "kept.stkpack").string()), want);
  // The raw pack holds whole decodes; the JPEGs are decoded for the crop (only its region,
  // shrunk in the DCT domain when the crop is 6x the output): the same crops and flips, pixels
  // within 1 level on average and 8 at most (levels of 1/255 over the smallest std, 0.225).
  const std::vector<uint8_t> raw_images = first_images("packed:" + (root / "raw.stkpack").string());
  ASSERT_EQ(raw_images.size(), want.size());
  std::vector<float> a(want.size() / sizeof(float)), b(a.size());
  std::memcpy(a.data(), want.data(), want.size());
  std::memcpy(b.data(), raw_images.data(), raw_images.size());
  double sum = 0, worst = 0;
  for (size_t i = 0; i < a.size(); i++) {
    double d = (static_cast<double>(a[i]) - static_cast<double>(b[i])) * 0.225 * 255.0;
    d = d < 0 ? -d : d;
    sum += d;
    worst = d > worst ? d : worst;
  }
  EXPECT_LE(sum / static_cast<double>(a.size()), 1.0);
  EXPECT_LE(worst, 8.5);
  EXPECT_EQ(first_images("packed:" + (root / "sliced").string()), want);

  stoker::PackOptions bad;
  bad.mode = "webp";
  try {
    stoker::pack(folder, (root / "bad.stkpack").string(), bad);
    ADD_FAILURE() << "a bad mode must throw";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("webp"), std::string::npos) << e.what();
  }
  fs::remove_all(root);
}
