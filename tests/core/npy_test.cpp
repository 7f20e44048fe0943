// Tests of .npy reading/writing and atomic file writes.
#include <gtest/gtest.h>

#include <filesystem>

#include "../test_util.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/npy.h"
#include "pathkernel/npy_array.h"

namespace pathkernel {
namespace {

using testing::error_message;
using testing::same_bits;

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

TEST(Npy, AFileInPartsIsTheBytesWrittenWithoutACopyOfAContiguousArray) {
  testing::TempDir dir("npy");
  const torch::Tensor t = torch::randn({4, 6}, torch::kFloat64);
  for (const torch::Tensor& a : {t, t.t(), t.to(torch::kFloat32)}) {  // contiguous, strided, another dtype
    const std::string bytes = npy_bytes(a);
    const NpyFile f = npy_file(a);
    EXPECT_EQ(f.size(), bytes.size());
    EXPECT_EQ(f.crc32(), crc32_of(bytes));
    write_npy_file(dir / "f.npy", f);
    EXPECT_EQ(read_file(dir / "f.npy"), bytes);
    write_npy(dir / "w.npy", a);
    EXPECT_EQ(read_file(dir / "w.npy"), bytes);
  }
  EXPECT_EQ(npy_file(t).array.data_ptr(), t.data_ptr()) << "a contiguous array is written from its own memory";
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
  // Read from a file, the same checks, naming the file.
  testing::TempDir dir("npy_corrupt");
  for (const auto& [bytes, message] : cases) {
    write_file_atomic(dir / "x.npy", bytes);
    const std::string e = error_message([&] { read_npy(dir / "x.npy"); });
    EXPECT_CONTAINS(e, message);
    EXPECT_CONTAINS(e, dir / "x.npy");
  }
  EXPECT_CONTAINS(error_message([&] { read_npy(dir.path()); }), "not a regular file");
}

/// .npy bytes with a hand-written header dictionary (version 1 or 2).
std::string npy_with_header(const std::string& dict, const std::string& data, int version = 1) {
  std::string out("\x93NUMPY", 6);
  out += static_cast<char>(version);
  out += '\0';
  const std::string header = dict + "\n";
  const size_t n = header.size();
  out += static_cast<char>(n & 0xff);
  out += static_cast<char>((n >> 8) & 0xff);
  if (version == 2) {
    out += static_cast<char>((n >> 16) & 0xff);
    out += static_cast<char>((n >> 24) & 0xff);
  }
  return out + header + data;
}

TEST(Npy, RejectsHostileHeadersWithAClearError) {
  const std::string eight(8, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      // Fuzzing regression: the old regex parser read "(2, -4)" as (2, 4).
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1, -1), }", eight),
       "expected a non-negative integer, found '-'"},
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1, x), }", eight),
       "expected a non-negative integer, found 'x'"},
      // Fuzzing regression: std::stoll threw std::out_of_range, not Error.
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }", eight),
       "overflows 64 bits"},
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", eight),
       "overflows 64 bits"},
      // 10^12 elements claimed by an 8-byte payload: refused before allocating.
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", eight),
       "data has 8 bytes, expected 8000000000000 for shape (1000000000000,)"},
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, }", eight), "no 'shape'"},
      {npy_with_header("{'descr': '<f8', 'shape': (1,), }", eight), "no 'fortran_order'"},
      {npy_with_header("{'fortran_order': False, 'shape': (1,), }", eight), "no 'descr'"},
      {npy_with_header("{'descr': '<f8', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", eight),
       "repeats 'descr'"},
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), 'x': 1}", eight),
       "unexpected key 'x'"},
      {npy_with_header("{'descr': '<f8', 'fortran_order': Maybe, 'shape': (1,), }", eight),
       "expected True or False"},
      {npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), } trailing", eight),
       "after the dictionary"},
      {npy_with_header("{'descr': '<f8", eight), "unterminated string"},
      {npy_with_header("{'descr': '>f8', 'fortran_order': False, 'shape': (1,), }", eight),
       "unsupported .npy dtype '>f8'"},
      // Fuzzing regression: std::regex overflowed the stack on a long header.
      {npy_with_header("{'descr': '" + std::string(200000, 'f') + "', 'fortran_order': False, 'shape': (1,), }",
                       eight, 2),
       "unsupported .npy dtype"},
      {npy_with_header("{'shape': (" + std::string(100000, '(') + "", eight, 2),
       "expected a non-negative integer"},
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
}

TEST(Npy, AcceptsHeadersNumpyWrites) {
  const std::string data(16, '\0');
  for (const std::string& dict :
       {std::string("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"),
        std::string("{\"descr\": \"<f8\", \"fortran_order\": False, \"shape\": (2,)}"),
        std::string("{'shape': (2, ), 'fortran_order': False, 'descr': '<f8'}     "),
        std::string("{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }")}) {
    torch::Tensor t = parse_npy(npy_with_header(dict, data), "x.npy");
    EXPECT_EQ(t.numel(), 2) << dict;
  }
  torch::Tensor scalar = parse_npy(
      npy_with_header("{'descr': '<i8', 'fortran_order': False, 'shape': (), }", std::string(8, '\0')), "s");
  EXPECT_EQ(scalar.dim(), 0);
  torch::Tensor v2 = parse_npy(
      npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", "", 2), "v2");
  EXPECT_EQ(v2.sizes(), (std::vector<int64_t>{0, 3}));
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

TEST(Files, Crc32UpdateExtendsTheCrcBlockByBlock) {
  const std::string a = "1234", b = "56789";
  EXPECT_EQ(crc32_update(0, "123456789", 9), 0xCBF43926u);
  EXPECT_EQ(crc32_update(crc32_update(0, a.data(), a.size()), b.data(), b.size()), 0xCBF43926u);
  // An empty block, even a null one, leaves the CRC as it was (zlib alone would restart it).
  const uint32_t head = crc32_update(0, a.data(), a.size());
  EXPECT_EQ(crc32_update(head, nullptr, 0), head);
  EXPECT_EQ(crc32_update(crc32_update(head, nullptr, 0), b.data(), b.size()), 0xCBF43926u);
}

TEST(SizeArithmetic, DetectsOverflow) {
  EXPECT_EQ(mul_no_overflow(1 << 20, 1 << 20, "x"), int64_t(1) << 40);
  EXPECT_THROW(mul_no_overflow(int64_t(1) << 40, int64_t(1) << 40, "steps x parameters"), Error);
}

/// An array's distinct values (by their bits) and its codes, as the recorder
/// stores an input of at most 256 values: values[codes] is the array.
std::pair<torch::Tensor, torch::Tensor> encode(const torch::Tensor& a) {
  const auto bits_type = a.element_size() == 8 ? torch::kLong : torch::kInt;
  const torch::Tensor bits = a.contiguous().view(bits_type);
  auto [table, inverse, counts] = torch::_unique2(bits.reshape(-1), /*sorted=*/true, /*return_inverse=*/true);
  (void)counts;
  return {inverse.to(torch::kUInt8).reshape(a.sizes()), table.view(a.scalar_type())};
}

TEST(NpyCodedArray, DecodesEveryDtypeBitForBit) {
  testing::TempDir dir("coded");
  torch::manual_seed(3);
  // 8-bit pixels scaled to [0, 1], with -0.0 and NaN among them: all 256 codes in use.
  torch::Tensor levels = torch::arange(256, torch::kFloat64) / 255.0;
  levels[1] = -0.0;
  levels[2] = std::nan("");
  const torch::Tensor pick = torch::randperm(256, torch::kLong).repeat({8}).view({32, 1, 8, 8});
  for (auto dtype : {torch::kFloat64, torch::kFloat32, torch::kInt64, torch::kInt32}) {
    const torch::Tensor a = dtype == torch::kFloat64 || dtype == torch::kFloat32
                                ? levels.to(dtype).index_select(0, pick.reshape(-1)).view(pick.sizes())
                                : (pick * 1000 - 7).to(dtype);
    auto [codes, values] = encode(a);
    ASSERT_EQ(values.size(0), 256);
    write_npy(dir / "train_x.codes.npy", codes);
    write_npy(dir / "train_x.values.npy", values);
    EXPECT_EQ(npy_array_files(dir.path(), "train_x"),
              (std::vector<std::string>{"train_x.codes.npy", "train_x.values.npy"}));
    const torch::Tensor back = read_npy_array(dir.path(), "train_x");
    EXPECT_TRUE(same_bits(back, a)) << dtype;
    EXPECT_TRUE(torch::equal(parse_npy_codes(read_file(dir / "train_x.codes.npy"), "codes"), codes));
  }
  // The uint8 codes' file is what numpy.save writes.
  EXPECT_NE(npy_bytes(torch::zeros({2}, torch::kUInt8)).find("'descr': '|u1'"), std::string::npos);
  // The plain form is read as before.
  std::filesystem::remove(dir / "train_x.codes.npy");
  std::filesystem::remove(dir / "train_x.values.npy");
  write_npy(dir / "train_x.npy", levels.view({16, 16}));
  EXPECT_TRUE(same_bits(read_npy_array(dir.path(), "train_x"), levels.view({16, 16})));
}

TEST(NpyCodedArray, RefusesABadPairNamingTheFileAndTheExpectation) {
  testing::TempDir dir("coded_bad");
  auto save = [&](const std::string& name, const torch::Tensor& t) { write_npy(dir / name, t); };
  auto reading = [&] { return error_message([&] { read_npy_array(dir.path(), "train_x"); }); };
  const torch::Tensor codes = torch::tensor({0, 1, 2, 1}, torch::kUInt8).view({2, 2});
  const torch::Tensor values = torch::tensor({0.5, -1.0, 2.0}, torch::kFloat32);
  save("train_x.codes.npy", codes);
  EXPECT_CONTAINS(reading(), "train_x.codes.npy but not train_x.values.npy");
  std::filesystem::remove(dir / "train_x.codes.npy");
  save("train_x.values.npy", values);
  EXPECT_CONTAINS(reading(), "train_x.values.npy but not train_x.codes.npy");
  save("train_x.codes.npy", codes);
  EXPECT_TRUE(torch::equal(read_npy_array(dir.path(), "train_x"),
                           torch::tensor({0.5, -1.0, 2.0, -1.0}, torch::kFloat32).view({2, 2})));
  save("train_x.npy", values);
  EXPECT_CONTAINS(reading(), "holds both train_x.npy and train_x.codes.npy");
  std::filesystem::remove(dir / "train_x.npy");
  EXPECT_CONTAINS(error_message([&] { read_npy_array(dir.path(), "test_x"); }),
                  "has no test_x.npy (nor the pair test_x.codes.npy and test_x.values.npy)");

  save("train_x.values.npy", values.slice(0, 0, 2));  // code 2 has no value
  EXPECT_CONTAINS(reading(), "code 2 is out of range of the table of 2 values");
  EXPECT_CONTAINS(reading(), "train_x.codes.npy");
  save("train_x.values.npy", values.view({3, 1}));
  EXPECT_CONTAINS(reading(), "the table of values has shape [3, 1], expected 1-D");
  save("train_x.values.npy", torch::zeros({257}, torch::kFloat32));
  EXPECT_CONTAINS(reading(), "the table holds 257 values, expected at most 256");
  save("train_x.values.npy", values);
  save("train_x.codes.npy", codes.to(torch::kInt32));
  EXPECT_CONTAINS(reading(), "'<i4', expected uint8 codes ('|u1', numpy.uint8)");
  save("train_x.codes.npy", torch::tensor(1, torch::kUInt8));
  EXPECT_CONTAINS(reading(), "codes of shape [], expected the array's shape");
  // A table's dtype is one of the readable ones (uint8 values are refused).
  save("train_x.codes.npy", codes);
  save("train_x.values.npy", torch::tensor({1, 2, 3}, torch::kUInt8));
  EXPECT_CONTAINS(reading(), "unsupported .npy dtype '|u1'");
  // Other readers still refuse uint8: a checkpoint is never codes.
  EXPECT_CONTAINS(error_message([&] { read_npy(dir / "train_x.codes.npy"); }), "unsupported .npy dtype '|u1'");
}

TEST(NpyCodedArray, ReadsALargeArrayBlockByBlock) {
  // Past 16 MiB an array is read into pages of its own, and codes a block
  // of 1 MiB at a time: every block decoded bit for bit, a bad code in the
  // last block found.
  testing::TempDir dir("coded_large");
  torch::manual_seed(5);
  const int64_t n = (int64_t{17} << 20) / 4 + 123;
  torch::Tensor codes = torch::randint(0, 200, {n / 4, 4}, torch::kLong).to(torch::kUInt8);
  const torch::Tensor values = torch::randn({200}, torch::kFloat32);
  const torch::Tensor decoded = values.index_select(0, codes.reshape(-1).to(torch::kLong)).view(codes.sizes());
  write_npy(dir / "train_x.codes.npy", codes);
  write_npy(dir / "train_x.values.npy", values);
  EXPECT_TRUE(same_bits(read_npy_array(dir.path(), "train_x"), decoded));
  write_npy(dir / "test_x.npy", decoded);
  EXPECT_TRUE(same_bits(read_npy(dir / "test_x.npy"), decoded));
  codes[-1][3] = 250;
  write_npy(dir / "train_x.codes.npy", codes);
  EXPECT_CONTAINS(error_message([&] { read_npy_array(dir.path(), "train_x"); }),
                  "code 250 is out of range of the table of 200 values");
}

}  // namespace
}  // namespace pathkernel
