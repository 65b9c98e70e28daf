// GoogleTest suite of stoker::IterableSource (a stream with no length) and of tar shards
// (`source("tar:PATTERN")`) through the C++ API.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <stoker/stoker.hpp>

namespace {

// Rank r of w streams ids r, r + w, ... below n (rank 0 stops `short_by` early) as
// x = int64 [id, -id] and label = id; id `bad` throws. Streams save their position.
class Ids : public stoker::IterableSource {
 public:
  Ids(int64_t n, int64_t short_by = 0, int64_t bad = -1, bool states = false)
      : n_(n), short_by_(short_by), bad_(bad), states_(states) {}

  std::unique_ptr<stoker::SampleStream> open(const stoker::StreamInfo& info,
                                             const std::string* resume) const override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      opened.push_back(info);
      resumes.push_back(resume ? *resume : std::string("-"));
    }
    auto stream = std::make_unique<Stream>();
    stream->parent = this;
    stream->step = static_cast<int64_t>(info.world_size);
    stream->next_id = static_cast<int64_t>(info.rank);
    int64_t count = (n_ - stream->next_id + stream->step - 1) / stream->step;
    if (info.rank == 0) count -= short_by_;
    stream->end = stream->next_id + count * stream->step;
    if (resume) stream->next_id = std::stoll(*resume);
    return stream;
  }
  bool saves_state() const override { return states_; }

  mutable std::mutex mutex_;
  mutable std::vector<stoker::StreamInfo> opened;
  mutable std::vector<std::string> resumes;
  mutable std::atomic<int> closed{0};

 private:
  struct Stream : stoker::SampleStream {
    const Ids* parent = nullptr;
    int64_t next_id = 0, step = 1, end = 0;
    ~Stream() override { parent->closed.fetch_add(1); }
    bool next(stoker::Sample& out) override {
      if (next_id >= end) return false;
      const int64_t id = next_id;
      next_id += step;
      if (id == parent->bad_) throw std::runtime_error("id " + std::to_string(id) + " is unlucky");
      const int64_t x[2] = {id, -id};
      out.put_tensor("x", stoker::DType::I64, {2}, x);
      out.put_label(id);
      return true;
    }
    std::optional<std::string> save_state() override {
      if (!parent->states_) return std::nullopt;
      return std::to_string(next_id);
    }
  };

  int64_t n_, short_by_, bad_;
  bool states_;
};

std::vector<int64_t> epoch_ids(stoker::Loader& loader, int* batches = nullptr) {
  std::vector<int64_t> ids;
  int n = 0;
  for (auto& batch : loader.epoch()) {
    const stoker::TensorView& x = batch.field("x");
    const stoker::TensorView& label = batch.field("label");
    for (int64_t r = 0; r < label.shape[0]; ++r) {
      const int64_t id = label.data_as<int64_t>()[r];
      EXPECT_EQ(x.data_as<int64_t>()[2 * r], id);
      EXPECT_EQ(x.data_as<int64_t>()[2 * r + 1], -id);
      ids.push_back(id);
    }
    ++n;
  }
  if (batches) *batches = n;
  return ids;
}

TEST(IterableSource, ARankReadsItsStreamInOrderAndTheLengthIsUnknown) {
  auto source = std::make_shared<Ids>(23);
  {
    stoker::Loader loader(stoker::Options().source(source).batch_size(4).num_workers(2).seed(6));
    EXPECT_EQ(loader.batches_per_epoch(), -1);
    std::vector<int64_t> ids = epoch_ids(loader);
    ASSERT_EQ(ids.size(), 23u);
    for (int64_t i = 0; i < 23; ++i) EXPECT_EQ(ids[static_cast<std::size_t>(i)], i);
    EXPECT_EQ(epoch_ids(loader).size(), 23u);
  }
  std::lock_guard<std::mutex> lock(source->mutex_);
  ASSERT_GE(source->opened.size(), 2u);
  EXPECT_EQ(source->opened[0].epoch, 0u);
  EXPECT_EQ(source->opened[1].epoch, 1u);
  EXPECT_EQ(source->opened[0].seed, 6u);
  EXPECT_EQ(source->opened[0].num_workers, 1u);
  EXPECT_EQ(source->closed.load(), static_cast<int>(source->opened.size()));
}

TEST(IterableSource, NumSamplesGivesEveryRankTheSameBatchCount) {
  for (std::size_t world : {2u, 3u}) {
    std::vector<int> batches;
    for (std::size_t rank = 0; rank < world; ++rank) {
      stoker::Loader loader(stoker::Options()
                                .source(std::make_shared<Ids>(31, 4))
                                .batch_size(4)
                                .num_workers(1)
                                .num_samples(31)
                                .shuffle_buffer(5)
                                .rank(rank)
                                .world_size(world));
      int n = 0;
      std::vector<int64_t> ids = epoch_ids(loader, &n);
      EXPECT_EQ(ids.size(), (31 + world - 1) / world);
      EXPECT_EQ(loader.batches_per_epoch(), n);
      for (int64_t id : ids) EXPECT_EQ(static_cast<std::size_t>(id) % world, rank);
      batches.push_back(n);
    }
    EXPECT_EQ(std::set<int>(batches.begin(), batches.end()).size(), 1u) << "world " << world;
  }
}

TEST(IterableSource, SameBatchesForAnyNumberOfWorkers) {
  auto run = [](std::size_t workers) {
    stoker::Loader loader(stoker::Options()
                              .source(std::make_shared<Ids>(50))
                              .batch_size(6)
                              .num_workers(workers)
                              .shuffle_buffer(9)
                              .seed(2));
    return epoch_ids(loader);
  };
  std::vector<int64_t> reference = run(0);
  EXPECT_EQ(reference.size(), 50u);
  EXPECT_FALSE(std::is_sorted(reference.begin(), reference.end()));
  EXPECT_EQ(run(3), reference);
}

TEST(IterableSource, ResumeContinuesFromTheStreamsOwnState) {
  auto options = [](std::shared_ptr<Ids> s) { return stoker::Options().source(s).batch_size(3).num_workers(2); };
  std::string state;
  std::vector<int64_t> got;
  {
    stoker::Loader loader(options(std::make_shared<Ids>(30, 0, -1, true)));
    for (int i = 0; i < 4; ++i) {
      auto batch = loader.next();
      ASSERT_TRUE(batch);
      for (int64_t r = 0; r < 3; ++r) got.push_back(batch->field("label").data_as<int64_t>()[r]);
    }
    state = loader.save_state();
  }
  auto source = std::make_shared<Ids>(30, 0, -1, true);
  stoker::Loader resumed(options(source).resume_state(state));
  std::vector<int64_t> rest = epoch_ids(resumed);
  got.insert(got.end(), rest.begin(), rest.end());
  ASSERT_EQ(got.size(), 30u);
  for (int64_t i = 0; i < 30; ++i) EXPECT_EQ(got[static_cast<std::size_t>(i)], i);
  std::lock_guard<std::mutex> lock(source->mutex_);
  EXPECT_EQ(source->resumes[0], "12");
}

TEST(IterableSource, AnExceptionFailsItsSampleOrIsReplaced) {
  stoker::Loader loader(stoker::Options().source(std::make_shared<Ids>(12, 0, 5)).batch_size(4).num_workers(1));
  int failed = 0;
  for (;;) {
    try {
      if (!loader.next()) break;
    } catch (const stoker::Error& e) {
      EXPECT_EQ(e.status(), stoker::Status::Callback);
      EXPECT_NE(std::string(e.what()).find("id 5 is unlucky"), std::string::npos) << e.what();
      ++failed;
    }
  }
  EXPECT_EQ(failed, 1);
  stoker::Loader skip(
      stoker::Options().source(std::make_shared<Ids>(12, 0, 5)).batch_size(4).num_workers(1).on_error("skip"));
  std::vector<int64_t> ids = epoch_ids(skip);
  EXPECT_EQ(ids.size(), 12u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 5), 0);
  EXPECT_EQ(skip.stats().samples_skipped, 1u);
}

TEST(IterableSource, NullSourceIsAnInvalidArgument) {
  try {
    stoker::Options().source(std::shared_ptr<const stoker::IterableSource>());
    FAIL() << "no throw";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::InvalidArgument);
  }
}

// One ustar member.
void tar_member(std::ofstream& f, const std::string& name, const std::string& data) {
  char h[512] = {};
  std::snprintf(h, 100, "%s", name.c_str());
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  std::snprintf(h + 124, 12, "%011o", static_cast<unsigned>(data.size()));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  f.write(h, 512);
  f.write(data.data(), static_cast<std::streamsize>(data.size()));
  const std::string pad((512 - data.size() % 512) % 512, '\0');
  f.write(pad.data(), static_cast<std::streamsize>(pad.size()));
}

TEST(TarShards, IndexedAndStreamingModesGiveEveryRankEqualBatches) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / "stoker_cxx_tar";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int sizes[3] = {9, 1, 6};
  for (int s = 0, id = 0; s < 3; ++s) {
    std::ofstream f(dir / ("part-" + std::to_string(s) + ".tar"), std::ios::binary);
    for (int k = 0; k < sizes[s]; ++k, ++id) {
      char key[16];
      std::snprintf(key, sizeof key, "k%05d", id);
      tar_member(f, std::string(key) + ".cls", std::to_string(id));
    }
    const std::string end(1024, '\0');
    f.write(end.data(), 1024);
  }
  const std::string pattern = "tar:" + (dir / "part-{0..2}.tar").string();
  for (std::size_t buffer : {0u, 4u}) {
    std::multiset<int64_t> seen;
    std::vector<int64_t> counts;
    for (std::size_t rank = 0; rank < 2; ++rank) {
      stoker::Loader loader(stoker::Options()
                                .source(pattern)
                                .fields("cls:label")
                                .shuffle(true)
                                .shuffle_buffer(buffer)
                                .batch_size(3)
                                .rank(rank)
                                .world_size(2)
                                .num_workers(2));
      counts.push_back(loader.batches_per_epoch());
      for (auto& batch : loader.epoch()) {
        const stoker::TensorView& label = batch.field("label");
        for (int64_t r = 0; r < label.shape[0]; ++r) seen.insert(label.data_as<int64_t>()[r]);
      }
    }
    EXPECT_EQ(counts[0], 3) << "buffer " << buffer;  // ceil(16 / 2) = 8 samples
    EXPECT_EQ(counts[1], 3) << "buffer " << buffer;
    EXPECT_EQ(seen.size(), 16u);
    for (int64_t id = 0; id < 16; ++id) EXPECT_EQ(seen.count(id), 1u) << id;
  }
  fs::remove_all(dir);
}

}  // namespace
