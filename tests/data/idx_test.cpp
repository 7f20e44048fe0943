// Tests of read_idx (plain and gzip files, corrupt headers, truncation) and
// of the fashion-mnist dataset, on the installed files and on tiny fakes.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "pathkernel/manifest.h"
#include "../test_util.h"

namespace {

namespace fs = std::filesystem;
using pathkernel::DataOptions;
using pathkernel::Dataset;
using pathkernel::read_idx;

using pathkernel::testing::error_message;
using pathkernel::testing::same_bits;
using pathkernel::testing::ScopedEnv;
using pathkernel::testing::TempDir;

using Bytes = std::vector<uint8_t>;

/// An IDX file's bytes: magic (0, 0, type, ndims), big-endian dims, data.
Bytes idx_bytes(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = 0x08) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

void write_gzip(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

Bytes read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

/// Deterministic incompressible bytes (a linear congruential generator).
Bytes noise_bytes(size_t n) {
  Bytes out(n);
  uint64_t state = 12345;
  for (auto& b : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    b = static_cast<uint8_t>(state >> 56);
  }
  return out;
}

std::vector<uint8_t> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<uint8_t>(c.data_ptr<uint8_t>(), c.data_ptr<uint8_t>() + c.numel());
}

// ---------------------------------------------------------------- read_idx

TEST(ReadIdx, ReadsPlainFile) {
  TempDir dir;
  const std::string path = dir.file("plain.idx");
  write_plain(path, idx_bytes({2, 3}, {0, 1, 2, 253, 254, 255}));
  const torch::Tensor t = read_idx(path);
  EXPECT_EQ(t.scalar_type(), torch::kUInt8);
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({2, 3}));
  EXPECT_EQ(to_vector(t), Bytes({0, 1, 2, 253, 254, 255}));
}

TEST(ReadIdx, ReadsGzipFile) {
  TempDir dir;
  const std::string path = dir.file("packed.idx.gz");
  const Bytes data = noise_bytes(2 * 4 * 5);
  write_gzip(path, idx_bytes({2, 4, 5}, data));
  ASSERT_EQ(read_all(path).at(0), 0x1f);  // really gzip on disk
  const torch::Tensor t = read_idx(path);
  EXPECT_EQ(t.sizes(), torch::IntArrayRef({2, 4, 5}));
  EXPECT_EQ(to_vector(t), data);
}

TEST(ReadIdx, BadMagicNamesBytesFoundAndExpected) {
  TempDir dir;
  const std::string path = dir.file("bad.idx");
  write_plain(path, {0x12, 0x34, 0x08, 0x01, 0, 0, 0, 1, 7});
  const std::string message = error_message([&] { read_idx(path); });
  EXPECT_CONTAINS(message, "bad IDX magic number in '" + path + "'");
  EXPECT_CONTAINS(message, "found bytes 0x12 0x34 0x08 0x01");
  EXPECT_CONTAINS(message, "expected 0x00 0x00");

  const std::string gz_path = dir.file("bad.idx.gz");
  write_gzip(gz_path, {0xab, 0x00, 0x08, 0x01, 0, 0, 0, 1, 7});
  EXPECT_CONTAINS(error_message([&] { read_idx(gz_path); }), "found bytes 0xab 0x00 0x08 0x01");
}

TEST(ReadIdx, UnsupportedElementTypeRejected) {
  TempDir dir;
  const std::string path = dir.file("float.idx");
  write_plain(path, idx_bytes({1}, {0, 0, 0, 0}, 0x0D));
  const std::string message = error_message([&] { read_idx(path); });
  EXPECT_CONTAINS(message, "unsupported IDX element type 0x0d (float32)");
  EXPECT_CONTAINS(message, "only 0x08 (unsigned byte)");
}

TEST(ReadIdx, DimensionCountOutsideOneToFourRejected) {
  TempDir dir;
  const std::string zero = dir.file("zero.idx");
  write_plain(zero, {0, 0, 0x08, 0});
  EXPECT_CONTAINS(error_message([&] { read_idx(zero); }), "gives 0 dimensions, expected 1 to 4");
  const std::string five = dir.file("five.idx");
  write_plain(five, idx_bytes({1, 1, 1, 1, 1}, {9}));
  EXPECT_CONTAINS(error_message([&] { read_idx(five); }), "gives 5 dimensions, expected 1 to 4");
}

TEST(ReadIdx, TruncatedMagicNamesOffset) {
  TempDir dir;
  const std::string path = dir.file("short.idx");
  write_plain(path, {0, 0});
  const std::string message = error_message([&] { read_idx(path); });
  EXPECT_CONTAINS(message, "truncated IDX file '" + path + "'");
  EXPECT_CONTAINS(message, "data ended at byte offset 2");
}

TEST(ReadIdx, TruncatedHeaderNamesOffset) {
  TempDir dir;
  const std::string path = dir.file("header.idx");
  write_plain(path, {0, 0, 0x08, 3, 0, 0, 0, 2, 0});  // 3 dims but only 5 bytes of them
  const std::string message = error_message([&] { read_idx(path); });
  EXPECT_CONTAINS(message, "data ended at byte offset 9");
  EXPECT_CONTAINS(message, "16-byte header");
}

TEST(ReadIdx, TruncatedDataNamesOffsetAndExpectedSize) {
  TempDir dir;
  const std::string path = dir.file("data.idx");
  write_plain(path, idx_bytes({10}, {1, 2, 3, 4}));
  EXPECT_EQ(error_message([&] { read_idx(path); }),
            "truncated IDX file '" + path +
                "': data ended at byte offset 12, expected 18 bytes (8-byte header + 10 bytes of "
                "data for shape [10])");

  // The same inside a complete gzip stream: offsets count uncompressed bytes.
  const std::string gz_path = dir.file("data.idx.gz");
  write_gzip(gz_path, idx_bytes({2, 5}, {1, 2, 3, 4, 5, 6, 7}));
  const std::string message = error_message([&] { read_idx(gz_path); });
  EXPECT_CONTAINS(message, "data ended at byte offset 19, expected 22 bytes");
}

TEST(ReadIdx, CutGzipStreamReportsTruncation) {
  TempDir dir;
  const std::string whole = dir.file("whole.idx.gz");
  write_gzip(whole, idx_bytes({20000}, noise_bytes(20000)));
  Bytes compressed = read_all(whole);
  ASSERT_GT(compressed.size(), 10000u);
  compressed.resize(compressed.size() / 2);
  const std::string cut = dir.file("cut.idx.gz");
  write_plain(cut, compressed);

  const std::string message = error_message([&] { read_idx(cut); });
  EXPECT_CONTAINS(message, "truncated IDX file '" + cut + "': data ended at byte offset ");
  EXPECT_CONTAINS(message, "expected 20008 bytes");
  // The offset is where decompression stopped: past the header, short of the end.
  const std::string marker = "byte offset ";
  const size_t at = message.find(marker);
  ASSERT_NE(at, std::string::npos);
  const long offset = std::stol(message.substr(at + marker.size()));
  EXPECT_GE(offset, 8);
  EXPECT_LT(offset, 20008);
}

TEST(ReadIdx, OverflowingAndNegativeDimensionsRejected) {
  TempDir dir;
  const std::string huge = dir.file("huge.idx");
  write_plain(huge, idx_bytes({0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff}, {}));
  EXPECT_CONTAINS(error_message([&] { read_idx(huge); }), "overflows");
  const std::string negative = dir.file("negative.idx");
  write_plain(negative, idx_bytes({0x80000000}, {}));
  EXPECT_CONTAINS(error_message([&] { read_idx(negative); }), "negative");
}

TEST(ReadIdx, HugeClaimedSizeOnShortFileIsTruncation) {
  TempDir dir;
  const std::string path = dir.file("claims.idx");
  write_plain(path, idx_bytes({0x7fffffff, 0x7fffffff}, {1, 2, 3}));
  EXPECT_CONTAINS(error_message([&] { read_idx(path); }), "data ended at byte offset 15");
}

TEST(ReadIdx, DataBeyondTheHeaderShapeRejected) {
  // Fuzzing regression: extra bytes were silently ignored, so a file whose
  // header gives the wrong shape read as a prefix of its data.
  TempDir dir;
  const std::string plain = dir.file("trailing.idx");
  write_plain(plain, idx_bytes({3}, {1, 2, 3, 4, 5}));
  std::string message = error_message([&] { read_idx(plain); });
  EXPECT_CONTAINS(message, "has data after byte offset 11");
  EXPECT_CONTAINS(message, "shape [3]");
  const std::string gz = dir.file("trailing.idx.gz");
  write_gzip(gz, idx_bytes({2, 2}, {1, 2, 3, 4, 5}));
  EXPECT_CONTAINS(error_message([&] { read_idx(gz); }), "has data after byte offset 16");
}

TEST(ReadIdx, TrillionElementHeaderFailsWithoutAllocating) {
  // 10000^3 = 10^12 elements claimed by a 32-byte file: refused as truncation
  // after reading what is there (the buffer grows with the data read).
  TempDir dir;
  const std::string path = dir.file("trillion.idx");
  write_plain(path, idx_bytes({10000, 10000, 10000}, Bytes(16, 7)));
  const std::string message = error_message([&] { read_idx(path); });
  EXPECT_CONTAINS(message, "truncated IDX file");
  EXPECT_CONTAINS(message, "1000000000000 bytes of data for shape [10000, 10000, 10000]");
}

TEST(ReadIdx, MissingFileNamed) {
  TempDir dir;
  const std::string path = dir.file("absent.idx");
  const std::string message = error_message([&] { read_idx(path); });
  EXPECT_CONTAINS(message, path);
  EXPECT_CONTAINS(message, "no such file");
}

TEST(ReadIdx, InstalledFashionFilesHoldRawBytes) {
  const std::string dir = pathkernel::fashion_mnist_dir();
  const torch::Tensor images = read_idx(dir + "/train-images-idx3-ubyte.gz");
  EXPECT_EQ(images.scalar_type(), torch::kUInt8);
  EXPECT_EQ(images.sizes(), torch::IntArrayRef({60000, 28, 28}));
  EXPECT_EQ(images.min().item<int64_t>(), 0);
  EXPECT_EQ(images.max().item<int64_t>(), 255);
  const torch::Tensor labels = read_idx(dir + "/train-labels-idx1-ubyte.gz");
  ASSERT_EQ(labels.sizes(), torch::IntArrayRef({60000}));
  const torch::Tensor test_labels = read_idx(dir + "/t10k-labels-idx1-ubyte.gz");
  ASSERT_EQ(test_labels.sizes(), torch::IntArrayRef({10000}));
  for (int64_t c = 0; c < 10; ++c) {  // Fashion-MNIST is exactly balanced
    EXPECT_EQ(labels.eq(c).sum().item<int64_t>(), 6000) << "class " << c;
    EXPECT_EQ(test_labels.eq(c).sum().item<int64_t>(), 1000) << "class " << c;
  }
}

// ----------------------------------------------------------- fashion-mnist

DataOptions fashion(int64_t train_size = -1, int64_t test_size = -1) {
  DataOptions options;
  options.spec = "fashion-mnist";
  options.train_size = train_size;
  options.test_size = test_size;
  return options;
}

TEST(FashionMnist, LoadsFullSplitsStandardised) {
  const Dataset data = pathkernel::load_dataset(fashion());
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({60000, 1, 28, 28}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({10000, 1, 28, 28}));
  EXPECT_EQ(data.y_train.sizes(), torch::IntArrayRef({60000}));
  EXPECT_EQ(data.y_test.sizes(), torch::IntArrayRef({10000}));
  EXPECT_EQ(data.x_train.scalar_type(), torch::kFloat64);
  EXPECT_EQ(data.y_train.scalar_type(), torch::kLong);
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({1, 28, 28}));
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_EQ(data.y_train.min().item<int64_t>(), 0);
  EXPECT_EQ(data.y_train.max().item<int64_t>(), 9);
  EXPECT_EQ(data.y_test.min().item<int64_t>(), 0);
  EXPECT_EQ(data.y_test.max().item<int64_t>(), 9);
  EXPECT_EQ(std::get<0>(at::_unique(data.y_train)).numel(), 10);

  EXPECT_NEAR(data.x_train.mean().item<double>(), 0.0, 1e-9);
  EXPECT_NEAR(data.x_train.std(/*unbiased=*/false).item<double>(), 1.0, 1e-9);
  EXPECT_EQ(data.normalization.at("kind"), "standardize");
  EXPECT_DOUBLE_EQ(data.normalization.at("scale").get<double>(), 1.0 / 255.0);
  // The recorded mean is that of the raw train pixels scaled by 1/255.
  const torch::Tensor raw = read_idx(pathkernel::fashion_mnist_dir() + "/train-images-idx3-ubyte.gz");
  EXPECT_NEAR(data.normalization.at("mean").get<double>(),
              raw.to(torch::kFloat64).mean().item<double>() / 255.0, 1e-12);
  EXPECT_EQ(data.source.at("files").size(), 4u);
}

TEST(FashionMnist, Float32SubsetIsBalanced) {
  DataOptions options = fashion(100, 30);
  options.dtype = torch::kFloat32;
  const Dataset data = pathkernel::load_dataset(options);
  EXPECT_EQ(data.x_train.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.x_test.scalar_type(), torch::kFloat32);
  EXPECT_EQ(data.x_train.sizes(), torch::IntArrayRef({100, 1, 28, 28}));
  EXPECT_EQ(data.x_test.sizes(), torch::IntArrayRef({30, 1, 28, 28}));
  for (int64_t c = 0; c < 10; ++c) {
    EXPECT_EQ(data.y_train.eq(c).sum().item<int64_t>(), 10);
    EXPECT_EQ(data.y_test.eq(c).sum().item<int64_t>(), 3);
  }
}

TEST(FashionMnist, MissingDirectorySaysWhatToInstall) {
  TempDir dir;
  const std::string absent = dir.file("does-not-exist");
  ScopedEnv env("PATHKERNEL_FASHION_MNIST", absent.c_str());
  EXPECT_EQ(pathkernel::fashion_mnist_dir(), absent);
  const std::string message = error_message([] { pathkernel::load_dataset(fashion()); });
  EXPECT_CONTAINS(message, absent + "/train-images-idx3-ubyte.gz");
  EXPECT_CONTAINS(message, "apt-get install dataset-fashion-mnist");
  EXPECT_CONTAINS(message, "PATHKERNEL_FASHION_MNIST");
}

TEST(FashionMnist, DefaultDirectoryWithoutEnvironment) {
  ScopedEnv env("PATHKERNEL_FASHION_MNIST", nullptr);
  EXPECT_EQ(pathkernel::fashion_mnist_dir(), "/usr/share/datasets/fashion-mnist");
}

/// Writes a tiny Fashion-MNIST look-alike (2x2 images) into `dir`.
void write_fake_fashion(const TempDir& dir, const std::vector<uint32_t>& train_image_dims,
                        const Bytes& train_pixels, const Bytes& train_labels,
                        const Bytes& test_pixels, const Bytes& test_labels) {
  write_gzip(dir.file("train-images-idx3-ubyte.gz"), idx_bytes(train_image_dims, train_pixels));
  // Plain bytes under a .gz name work too (gzread passes them through).
  write_plain(dir.file("train-labels-idx1-ubyte.gz"),
              idx_bytes({static_cast<uint32_t>(train_labels.size())}, train_labels));
  write_gzip(dir.file("t10k-images-idx3-ubyte.gz"),
             idx_bytes({static_cast<uint32_t>(test_labels.size()), 2, 2}, test_pixels));
  write_gzip(dir.file("t10k-labels-idx1-ubyte.gz"),
             idx_bytes({static_cast<uint32_t>(test_labels.size())}, test_labels));
}

TEST(FashionMnist, ImageAndLabelCountsMustAgree) {
  TempDir dir;
  write_fake_fashion(dir, {3, 2, 2}, Bytes(12, 0), {0, 1}, Bytes(4, 0), {0});
  ScopedEnv env("PATHKERNEL_FASHION_MNIST", dir.file("").c_str());
  const std::string message = error_message([] { pathkernel::load_dataset(fashion()); });
  EXPECT_CONTAINS(message, "holds 3 images but");
  EXPECT_CONTAINS(message, "holds 2 labels");
}

TEST(FashionMnist, StandardisesWithFullTrainStatistics) {
  // Train: three black images (class 0) and one white (class 1). Scaled to
  // [0,1] the pixels are 0,0,0,1 repeated: mean 1/4, variance
  // 1/4*(3/4)^2 + 3/4*(1/4)^2 = 3/16, std sqrt(3)/4.
  TempDir dir;
  Bytes train(16, 0);
  std::fill(train.begin() + 12, train.end(), 255);
  write_fake_fashion(dir, {4, 2, 2}, train, {0, 0, 0, 1}, {255, 51, 0, 102}, {3});
  ScopedEnv env("PATHKERNEL_FASHION_MNIST", dir.file("").c_str());

  const double mean = 0.25;
  const double sd = std::sqrt(3.0) / 4.0;
  // A 2-example subset has other statistics; the full train split's are used.
  const Dataset data = pathkernel::load_dataset(fashion(2));
  EXPECT_EQ(data.input_shape, std::vector<int64_t>({1, 2, 2}));
  EXPECT_NEAR(data.normalization.at("mean").get<double>(), mean, 1e-12);
  EXPECT_NEAR(data.normalization.at("std").get<double>(), sd, 1e-12);
  ASSERT_EQ(data.x_train.sizes(), torch::IntArrayRef({2, 1, 2, 2}));
  ASSERT_EQ(data.y_train[0].item<int64_t>(), 0);
  ASSERT_EQ(data.y_train[1].item<int64_t>(), 1);
  EXPECT_NEAR(data.x_train[0][0][0][0].item<double>(), -mean / sd, 1e-12);  // -1/sqrt(3)
  EXPECT_NEAR(data.x_train[1][0][1][1].item<double>(), (1 - mean) / sd, 1e-12);  // sqrt(3)
  const torch::Tensor expected_test =
      torch::tensor({1.0, 0.2, 0.0, 0.4}, torch::kFloat64).sub(mean).div(sd).view({1, 1, 2, 2});
  EXPECT_TRUE(torch::allclose(data.x_test, expected_test, 1e-12, 1e-12)) << data.x_test;
  EXPECT_EQ(data.y_test[0].item<int64_t>(), 3);
}


TEST(FashionMnist, CodedInputsDecodeToTheBitsOfTheWholeSplits) {
  // 64 2x2 training images holding every byte once, in a shuffled order.
  Bytes train(256), labels(64);
  for (int v = 0; v < 256; ++v) train[static_cast<size_t>((v * 97) % 256)] = static_cast<uint8_t>(v);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<uint8_t>(i % 2);
  TempDir dir;
  write_fake_fashion(dir, {64, 2, 2}, train, labels, {9, 200, 31, 4}, {2});
  ScopedEnv env("PATHKERNEL_FASHION_MNIST", dir.file("").c_str());
  for (const torch::Dtype dtype : {torch::kFloat64, torch::kFloat32}) {
    for (const int64_t train_size : {int64_t{-1}, int64_t{4}}) {
      DataOptions options = fashion(train_size);
      options.dtype = dtype;
      const Dataset whole = pathkernel::load_dataset(options);
      options.coded_inputs = true;
      const Dataset coded = pathkernel::load_dataset(options);
      EXPECT_FALSE(coded.x_train.defined());
      ASSERT_TRUE(coded.x_train_coded.defined());
      EXPECT_EQ(pathkernel::train_count(coded), whole.x_train.size(0));
      EXPECT_TRUE(same_bits(pathkernel::train_inputs(coded, torch::Tensor()), whole.x_train)) << dtype;
      const torch::Tensor index = torch::tensor({1, 0, 1}, torch::kLong);
      EXPECT_TRUE(same_bits(pathkernel::train_inputs(coded, index), whole.x_train.index_select(0, index)));
      EXPECT_TRUE(same_bits(pathkernel::train_input(coded, 1), whole.x_train[1]));
      EXPECT_EQ(pathkernel::training_data_crc32(coded),
                pathkernel::training_data_crc32(whole.x_train, whole.y_train));
      EXPECT_FALSE(coded.x_test.defined());
      ASSERT_TRUE(coded.x_test_coded.defined());
      EXPECT_EQ(pathkernel::test_count(coded), whole.x_test.size(0));
      EXPECT_TRUE(same_bits(pathkernel::test_inputs(coded, torch::Tensor()), whole.x_test)) << dtype;
      EXPECT_TRUE(same_bits(pathkernel::test_input(coded, 0), whole.x_test[0]));
      EXPECT_EQ(pathkernel::input_dtype(coded), dtype);
    }
  }
}

}  // namespace
