// Tests of .npy reading/writing and atomic file writes.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"

namespace pathkernel {
namespace {

TEST(Npy, RoundTripsEveryDtypeAndShape) {
  testing::TempDir dir("npy");
  const std::vector<std::vector<int64_t>> shapes = {{7}, {3, 4}, {2, 1, 5}, {0}};
  for (auto dtype : {torch::kFloat64, torch::kFloat32, torch::kInt64, torch::kInt32}) {
    for (const auto& shape : shapes) {
      torch::Tensor t = (torch::randn(shape, torch::kFloat64) * 100).to(dtype);
      write_npy(dir / "t.npy", t);
      torch::Tensor back = read_npy(dir / "t.npy");
      EXPECT_EQ(back.scalar_type(), dtype);
      EXPECT_EQ(back.sizes(), t.sizes());
      EXPECT_TRUE(torch::equal(back, t)) << dtype << " " << t.sizes();
    }
  }
}

TEST(Npy, WritesTheHeaderNumpyExpects) {
  std::string bytes = npy_bytes(torch::zeros({3, 2}, torch::kFloat64));
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_NE(bytes.find("{'descr': '<f8', 'fortran_order': False, 'shape': (3, 2), }"), std::string::npos);
  EXPECT_EQ(bytes.size(), 128u + 48u);
  EXPECT_EQ(bytes[127], '\n');
}

TEST(Npy, RejectsCorruptFiles) {
  std::string good = npy_bytes(torch::ones({4}, torch::kFloat64));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"garbage", "bad magic"},
      {good.substr(0, good.size() - 1), "data has 31 bytes, expected 32"},
      {good.substr(0, 40), "truncated .npy header"},
      {[&] { std::string s = good; s.replace(s.find("<f8"), 3, "<c8"); return s; }(), "unsupported .npy dtype '<c8'"},
      {[&] { std::string s = good; s.replace(s.find("False"), 5, "True "); return s; }(), "C order"},
  };
  for (const auto& [bytes, message] : cases) {
    try {
      parse_npy(bytes, "x.npy");
      ADD_FAILURE() << "no error, expected " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("x.npy"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(read_npy("/nonexistent/x.npy"), Error);
}

TEST(Files, AtomicWriteLeavesOnlyTheFinalFile) {
  testing::TempDir dir("atomic");
  write_file_atomic(dir / "a.txt", "first");
  write_file_atomic(dir / "a.txt", "second");
  EXPECT_EQ(read_file(dir / "a.txt"), "second");
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir.str())) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  EXPECT_THROW(write_file_atomic(dir / "no/such/dir/a.txt", "x"), Error);
}

TEST(Files, Crc32MatchesTheStandardCheckValue) {
  EXPECT_EQ(crc32_of("123456789"), 0xCBF43926u);  // the CRC-32 catalogue's check value
}

TEST(SizeArithmetic, DetectsOverflow) {
  EXPECT_EQ(mul_no_overflow(1 << 20, 1 << 20, "x"), int64_t(1) << 40);
  EXPECT_THROW(mul_no_overflow(int64_t(1) << 40, int64_t(1) << 40, "steps x parameters"), Error);
}

}  // namespace
}  // namespace pathkernel
