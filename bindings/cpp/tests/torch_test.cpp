// Tests of the LibTorch adapter (stoker/torch.hpp), C++20.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <stoker/torch.hpp>

#include "npy.hpp"

namespace {

constexpr int64_t kRows = 40;

// images.npy: uint8 [kRows, 3, 4, 4], every byte of image i is i; labels.npy: int64, label i = i+100;
// feats.npy: float32 [kRows, 5], row i = {i + j/10}.
class TorchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "stoker_torch_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_";
    std::vector<uint8_t> images(kRows * 48);
    std::vector<int64_t> labels(kRows);
    std::vector<float> feats(kRows * 5);
    for (int64_t i = 0; i < kRows; ++i) {
      for (int64_t j = 0; j < 48; ++j) images[i * 48 + j] = static_cast<uint8_t>(i);
      labels[i] = i + 100;
      for (int64_t j = 0; j < 5; ++j) feats[i * 5 + j] = static_cast<float>(i) + static_cast<float>(j) / 10;
    }
    stoker_test::write_npy(dir_ + "images.npy", "|u1", {kRows, 3, 4, 4}, images);
    stoker_test::write_npy(dir_ + "labels.npy", "<i8", {kRows}, labels);
    stoker_test::write_npy(dir_ + "feats.npy", "<f4", {kRows, 5}, feats);
  }

  stoker::Options options() const {
    return stoker::Options()
        .source("npy:" + dir_ + "images.npy")
        .labels("npy:" + dir_ + "labels.npy")
        .batch_size(8)
        .num_workers(2);
  }

  std::string dir_;
};

TEST_F(TorchTest, TensorIsAZeroCopyViewOfTheField) {
  stoker::Loader loader(options());
  auto batch = std::make_shared<const stoker::Batch>(std::move(loader.next().value()));
  torch::Tensor images = stoker::to_tensor(batch, "data");
  torch::Tensor labels = stoker::to_tensor(batch, std::size_t{1});
  EXPECT_EQ(images.data_ptr(), batch->field("data").data);
  EXPECT_EQ(labels.data_ptr(), batch->field("label").data);
  EXPECT_EQ(images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(labels.scalar_type(), torch::kInt64);
  EXPECT_EQ(images.sizes(), (std::vector<int64_t>{8, 3, 4, 4}));
  EXPECT_EQ(images.strides(), (std::vector<int64_t>{48, 16, 4, 1}));
  EXPECT_TRUE(images.device().is_cpu());
  for (int64_t r = 0; r < 8; ++r) {
    EXPECT_EQ(images[r].min().item<uint8_t>(), r);
    EXPECT_EQ(images[r].max().item<uint8_t>(), r);
    EXPECT_EQ(labels[r].item<int64_t>(), r + 100);
  }
  // Writing through the tensor writes the batch memory.
  images[0].fill_(200);
  EXPECT_EQ(batch->field("data").data_as<uint8_t>()[0], 200);
}

TEST_F(TorchTest, TensorsOutliveTheBatchAndTheLoader) {
  torch::Tensor images, labels, view;
  std::weak_ptr<const stoker::Batch> watch;
  {
    stoker::Loader loader(options().shuffle(true).seed(9));
    loader.next();  // skip one, to hold a batch that is not the first
    auto batch = std::make_shared<const stoker::Batch>(std::move(loader.next().value()));
    watch = batch;
    images = stoker::to_tensor(batch, "data");
    labels = stoker::to_tensor(batch, "label");
  }  // the Loader and the last shared_ptr held outside the tensors are gone
  EXPECT_FALSE(watch.expired()) << "the tensors keep the batch leased";
  for (int64_t r = 0; r < 8; ++r) {
    const int64_t i = labels[r].item<int64_t>() - 100;
    EXPECT_EQ(images[r].min().item<uint8_t>(), i);
    EXPECT_EQ(images[r].max().item<uint8_t>(), i);
  }
  view = images.slice(0, 2, 4);  // a view shares the storage, so it keeps the lease too
  images = torch::Tensor();
  labels = torch::Tensor();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(view.size(0), 2);
  view = torch::Tensor();
  EXPECT_TRUE(watch.expired()) << "the batch is released when its last tensor dies";
}

TEST_F(TorchTest, ToTensorsWrapsEveryFieldInOrder) {
  stoker::Loader loader(stoker::Options().source("npy:" + dir_ + "feats.npy").batch_size(16).num_workers(0));
  stoker::Batch batch = std::move(loader.next().value());
  void* data = batch.field(0).data;
  auto tensors = stoker::to_tensors(std::move(batch));
  EXPECT_FALSE(batch.valid());
  ASSERT_EQ(tensors.size(), 1u);
  EXPECT_EQ(tensors[0].first, "data");
  const torch::Tensor& t = tensors[0].second;
  EXPECT_EQ(t.data_ptr(), data);
  EXPECT_EQ(t.scalar_type(), torch::kFloat32);
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{16, 5}));
  EXPECT_FLOAT_EQ(t[3][2].item<float>(), 3.2f);
  // A training step may normalize in place.
  t.mul_(2);
  EXPECT_FLOAT_EQ(t[3][2].item<float>(), 6.4f);
}

TEST_F(TorchTest, UnknownFieldThrows) {
  stoker::Loader loader(options());
  auto batch = std::make_shared<const stoker::Batch>(std::move(loader.next().value()));
  EXPECT_THROW(stoker::to_tensor(batch, "image"), stoker::Error);
  EXPECT_THROW(stoker::to_tensor(batch, std::size_t{7}), stoker::Error);
}

TEST(TorchDType, EveryStokerDTypeHasATorchType) {
  EXPECT_EQ(stoker::scalar_type(stoker::DType::F16), torch::kFloat16);
  EXPECT_EQ(stoker::scalar_type(stoker::DType::BF16), torch::kBFloat16);
  EXPECT_EQ(stoker::scalar_type(stoker::DType::U16), torch::kUInt16);
  EXPECT_EQ(stoker::scalar_type(stoker::DType::I32), torch::kInt32);
}

// A CUDA field (device_type 2) with the CPU-only LibTorch of the tests: UNSUPPORTED, saying so,
// and never a CPU tensor over a device pointer. (A real CUDA batch needs a GPU; this fakes the
// view's device on a host batch to reach the device branch.)
TEST_F(TorchTest, CudaFieldNeedsCudaLibTorch) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this LibTorch has CUDA";
  stoker::Loader loader(options());
  auto batch = std::make_shared<const stoker::Batch>(std::move(loader.next().value()));
  stoker::TensorView view = batch->field("data");
  view.device_type = 2;
  view.device_id = 1;
  try {
    stoker::to_tensor(batch, view);
    FAIL() << "no exception";
  } catch (const stoker::Error& e) {
    EXPECT_EQ(e.status(), stoker::Status::Unsupported);
    const std::string what = e.what();
    EXPECT_NE(what.find("CUDA memory (device 1)"), std::string::npos) << what;
  }
  view.device_type = 7;  // not a device stoker makes
  EXPECT_THROW(stoker::to_tensor(batch, view), stoker::Error);
  // A host batch has no CUDA stream, and waiting on one is a no-op.
  EXPECT_EQ(batch->cuda_stream(), nullptr);
  EXPECT_NO_THROW(batch->wait(nullptr));
}

}  // namespace
