// Reading and writing NumPy .npy (format version 1.0).
#include "pathkernel/npy.h"
#include "pathkernel/npy_array.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <vector>

#include "pathkernel/error.h"
#include "pathkernel/files.h"

namespace pathkernel {

namespace {
const char kMagic[] = "\x93NUMPY";

std::string descr_of(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat64: return "<f8";
    case torch::kFloat32: return "<f4";
    case torch::kInt64: return "<i8";
    case torch::kInt32: return "<i4";
    case torch::kUInt8: return "|u1";
    default: PK_THROW("cannot write dtype " << dtype << " to .npy: expected float64, float32, int64, int32 or uint8");
  }
}

torch::Dtype dtype_of(const std::string& descr, const std::string& what, bool codes) {
  if (codes) {
    PK_CHECK(descr == "|u1" || descr == "<u1",
             what << ": .npy dtype '" << descr << "', expected uint8 codes ('|u1', numpy.uint8)");
    return torch::kUInt8;
  }
  if (descr == "<f8") return torch::kFloat64;
  if (descr == "<f4") return torch::kFloat32;
  if (descr == "<i8") return torch::kInt64;
  if (descr == "<i4") return torch::kInt32;
  PK_THROW(what << ": unsupported .npy dtype '" << descr << "': expected <f8, <f4, <i8 or <i4");
}
}  // namespace

namespace {

/// The .npy header of contiguous array t: magic, version, length and the
/// header dictionary, padded so that the data starts at a multiple of 64.
std::string npy_header(const torch::Tensor& t) {
  std::string shape = "(";
  for (int64_t d : t.sizes()) shape += std::to_string(d) + ", ";
  if (t.dim() > 1) shape.erase(shape.size() - 2);  // "(3, 4)"; 1-D keeps "(3,)"
  if (t.dim() == 1) shape.erase(shape.size() - 1);
  shape += ")";
  std::string header = "{'descr': '" + descr_of(t.scalar_type()) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic, 6);
  out += '\x01';
  out += '\x00';
  uint16_t len = static_cast<uint16_t>(header.size());
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>(len >> 8);
  out += header;
  return out;
}

/// The bytes of contiguous array t's data, in place.
std::string_view data_bytes(const torch::Tensor& t) {
  return {static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size()};
}

}  // namespace

std::vector<std::string_view> NpyFile::parts() const { return {header, data_bytes(array)}; }

size_t NpyFile::size() const { return header.size() + data_bytes(array).size(); }

uint32_t NpyFile::crc32() const {
  uint32_t crc = 0;
  for (const std::string_view& p : parts()) crc = crc32_update(crc, p.data(), p.size());
  return crc;
}

NpyFile npy_file(const torch::Tensor& tensor) {
  NpyFile f;
  f.array = tensor.detach().contiguous().cpu();
  f.header = npy_header(f.array);
  return f;
}

std::string npy_bytes(const torch::Tensor& tensor) {
  const NpyFile f = npy_file(tensor);
  std::string out = f.header;
  out += data_bytes(f.array);
  return out;
}

void write_npy_file(const std::string& path, const NpyFile& file) { write_parts_atomic(path, file.parts()); }

namespace {

/// The header dictionary of a .npy file, e.g.
/// {'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  std::string shape_text;  ///< as written, for messages
};

/// A strict parser of the header's Python literal: a dict with exactly the
/// keys 'descr' (a string), 'fortran_order' (True or False) and 'shape' (a
/// tuple of non-negative integers). Hand-written rather than std::regex, whose
/// recursive matcher overflows the stack on long headers.
class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& what) : text_(text), what_(what) {}

  NpyHeader parse() {
    NpyHeader h;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_space();
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = quoted("a quoted key");
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        PK_CHECK(!seen_descr, what_ << ": .npy header repeats 'descr'");
        seen_descr = true;
        h.descr = quoted("the dtype string");
      } else if (key == "fortran_order") {
        PK_CHECK(!seen_order, what_ << ": .npy header repeats 'fortran_order'");
        seen_order = true;
        h.fortran_order = boolean();
      } else if (key == "shape") {
        PK_CHECK(!seen_shape, what_ << ": .npy header repeats 'shape'");
        seen_shape = true;
        const size_t begin = pos_;
        h.shape = tuple();
        h.shape_text = text_.substr(begin, pos_ - begin);
      } else {
        PK_THROW(what_ << ": .npy header has an unexpected key '" << key
                       << "' (expected 'descr', 'fortran_order' and 'shape')");
      }
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      PK_CHECK(peek() == '}', what_ << ": malformed .npy header at byte " << pos_
                                    << ": expected ',' or '}', found " << found());
      break;
    }
    expect('}');
    skip_space();
    PK_CHECK(pos_ == text_.size(), what_ << ": malformed .npy header: unexpected " << found()
                                         << " at byte " << pos_ << " after the dictionary");
    PK_CHECK(seen_descr, what_ << ": .npy header has no 'descr'");
    PK_CHECK(seen_order, what_ << ": .npy header has no 'fortran_order'");
    PK_CHECK(seen_shape, what_ << ": .npy header has no 'shape'");
    return h;
  }

 private:
  int peek() const { return pos_ < text_.size() ? static_cast<unsigned char>(text_[pos_]) : -1; }

  std::string found() const {
    if (pos_ >= text_.size()) return "the end of the header";
    const unsigned char c = static_cast<unsigned char>(text_[pos_]);
    std::ostringstream out;
    if (c >= 0x20 && c < 0x7f) {
      out << "'" << static_cast<char>(c) << "'";
    } else {
      out << "byte 0x" << std::hex << static_cast<unsigned>(c);
    }
    return out.str();
  }

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' ||
                                   text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  void expect(char c) {
    PK_CHECK(peek() == static_cast<unsigned char>(c),
             what_ << ": malformed .npy header at byte " << pos_ << ": expected '" << c
                   << "', found " << found());
    ++pos_;
  }

  std::string quoted(const char* expected) {
    const int q = peek();
    PK_CHECK(q == '\'' || q == '"', what_ << ": malformed .npy header at byte " << pos_
                                           << ": expected " << expected << ", found " << found());
    const size_t close = text_.find(static_cast<char>(q), pos_ + 1);
    PK_CHECK(close != std::string::npos,
             what_ << ": malformed .npy header: unterminated string at byte " << pos_);
    std::string out = text_.substr(pos_ + 1, close - pos_ - 1);
    pos_ = close + 1;
    return out;
  }

  bool boolean() {
    if (text_.compare(pos_, 4, "True") == 0) {
      pos_ += 4;
      return true;
    }
    if (text_.compare(pos_, 5, "False") == 0) {
      pos_ += 5;
      return false;
    }
    PK_THROW(what_ << ": malformed .npy header at byte " << pos_
                   << ": expected True or False for 'fortran_order', found " << found());
  }

  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (true) {
      skip_space();
      if (peek() == ')') break;
      PK_CHECK(peek() >= '0' && peek() <= '9',
               what_ << ": malformed .npy shape at byte " << pos_
                     << ": expected a non-negative integer, found " << found());
      int64_t d = 0;
      while (peek() >= '0' && peek() <= '9') {
        const int digit = peek() - '0';
        PK_CHECK(d <= (std::numeric_limits<int64_t>::max() - digit) / 10,
                 what_ << ": .npy shape dimension at byte " << pos_ << " overflows 64 bits");
        d = d * 10 + digit;
        ++pos_;
      }
      PK_CHECK(dims.size() < 32, what_ << ": .npy shape has more than 32 dimensions");
      dims.push_back(d);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      PK_CHECK(peek() == ')', what_ << ": malformed .npy shape at byte " << pos_
                                    << ": expected ',' or ')', found " << found());
    }
    expect(')');
    return dims;
  }

  const std::string& text_;
  const std::string& what_;
  size_t pos_ = 0;
};

}  // namespace

namespace {

/// Where a .npy file's array lies: its dtype and shape, and its data's
/// offset and size in bytes.
struct NpyLayout {
  torch::Dtype dtype;
  std::vector<int64_t> shape;
  size_t data_offset = 0;
  size_t data_bytes = 0;
};

/// The bytes from a .npy file's start to its data's: its magic, version,
/// header length and header. `head` holds the file's first bytes (all of
/// them when it is shorter), `total` its size.
size_t header_end(const std::string& head, size_t total, const std::string& what, size_t* offset) {
  PK_CHECK(total >= 10 && head.size() >= 10 && std::memcmp(head.data(), kMagic, 6) == 0,
           what << ": not a .npy file (bad magic; expected \\x93NUMPY)");
  unsigned major = static_cast<unsigned char>(head[6]);
  size_t header_len;
  if (major == 1) {
    header_len = static_cast<unsigned char>(head[8]) | (static_cast<unsigned char>(head[9]) << 8);
    *offset = 10;
  } else {
    PK_CHECK(major == 2 || major == 3, what << ": unsupported .npy version " << major);
    PK_CHECK(total >= 12 && head.size() >= 12, what << ": truncated .npy header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(head[8 + i]);
    *offset = 12;
  }
  PK_CHECK(total >= *offset + header_len, what << ": truncated .npy header (file has " << total
                                               << " bytes, header needs " << *offset + header_len << ")");
  return *offset + header_len;
}

/// The layout of a .npy file of `total` bytes whose first bytes, at least
/// to its data's start (header_end), are `head`. Sizes are checked against
/// the bytes present, with overflow-checked arithmetic, before anything is
/// allocated.
NpyLayout layout_of(const std::string& head, size_t total, const std::string& what, bool codes) {
  size_t offset = 0;
  const size_t end = header_end(head, total, what, &offset);
  PK_ASSERT(head.size() >= end);
  const NpyHeader header = HeaderParser(head.substr(offset, end - offset), what).parse();
  NpyLayout l;
  l.dtype = dtype_of(header.descr, what, codes);
  PK_CHECK(!header.fortran_order, what << ": .npy file must be C order (fortran_order False)");
  const std::string count_what = what + ": .npy element count";
  int64_t numel = 1;
  for (int64_t d : header.shape) numel = mul_no_overflow(numel, d, count_what.c_str());
  const size_t esize = torch::elementSize(l.dtype);
  l.data_offset = end;
  l.data_bytes = static_cast<size_t>(
      mul_no_overflow(numel, static_cast<int64_t>(esize), (what + ": .npy byte count").c_str()));
  PK_CHECK(total - l.data_offset == l.data_bytes,
           what << ": .npy data has " << total - l.data_offset << " bytes, expected " << l.data_bytes
                << " for shape " << header.shape_text);
  l.shape = header.shape;
  return l;
}

torch::Tensor parse(const std::string& bytes, const std::string& what, bool codes) {
  const NpyLayout l = layout_of(bytes, bytes.size(), what, codes);
  torch::Tensor t = torch::empty(l.shape, torch::TensorOptions().dtype(l.dtype));
  if (l.data_bytes > 0) std::memcpy(t.data_ptr(), bytes.data() + l.data_offset, l.data_bytes);
  return t;
}

/// Arrays of at least this many bytes are read into pages of their own
/// (empty_for_reading).
constexpr size_t kPlainPagesBytes = size_t{16} << 20;

/// An empty array for a file's data: one of kPlainPagesBytes or more in
/// anonymous pages of its own, without the huge-page advice the allocator
/// gives the memory it takes (src/program/allocator.h). A data set is read once,
/// front to back, and then by rows: huge pages save it few TLB misses, and
/// on a virtual machine whose host backs fresh huge pages lazily they cost
/// seconds (the user CNN's 188 MB Fashion-MNIST images: about 3.5 s of a
/// `verify`'s start, BENCHMARKS.md at `1abb9c4`).
/// `bytes` is the array's size: a plain array's data bytes, which layout_of
/// checks against overflow and the file's size; for a coded array, its
/// codes (a byte each, so at most the file's size) times the values'
/// element size.
torch::Tensor empty_for_reading(const std::vector<int64_t>& shape, torch::Dtype dtype, size_t bytes) {
  const torch::TensorOptions options = torch::TensorOptions().dtype(dtype);
  if (bytes < kPlainPagesBytes) return torch::empty(shape, options);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PK_CHECK(p != MAP_FAILED, "cannot allocate " << bytes << " bytes for an array of shape " << c10::IntArrayRef(shape)
                                               << ": " << std::strerror(errno));
  return torch::from_blob(p, shape, [bytes](void* q) { ::munmap(q, bytes); }, options);
}

/// A file open for reading, its size known.
class InFile {
 public:
  explicit InFile(const std::string& path) : path_(path), fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    PK_CHECK(fd_ >= 0, "cannot open '" << path << "': " << std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      PK_THROW("cannot read '" << path << "': not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
  }
  ~InFile() { ::close(fd_); }
  InFile(const InFile&) = delete;
  InFile& operator=(const InFile&) = delete;

  size_t size() const { return size_; }

  /// Bytes [at, at + n) into out: all of them, or Error.
  void read(size_t at, size_t n, void* out) const {
    char* o = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t got = ::pread(fd_, o, n, static_cast<off_t>(at));
      if (got < 0 && errno == EINTR) continue;
      PK_CHECK(got > 0, "cannot read '" << path_ << "' at byte " << at << ": "
                                        << (got == 0 ? "the file ended early" : std::strerror(errno)));
      o += got;
      at += static_cast<size_t>(got);
      n -= static_cast<size_t>(got);
    }
  }

  /// The file's first bytes, up to its data's start (header_end) or its end.
  std::string head() const {
    std::string h(std::min<size_t>(size_, 4096), '\0');
    read(0, h.size(), h.data());
    size_t offset = 0;
    const size_t end = header_end(h, size_, path_, &offset);
    if (end > h.size()) {
      const size_t have = h.size();
      h.resize(end);
      read(have, end - have, h.data() + have);
    }
    return h;
  }

 private:
  std::string path_;
  int fd_;
  size_t size_ = 0;
};

/// The values of a coded array: a 1-D table of at most kMaxCodedValues.
void check_values(const torch::Tensor& values, const std::string& what) {
  PK_CHECK(values.dim() == 1, what << ": the table of values has shape " << values.sizes()
                                   << ", expected 1-D [at most " << kMaxCodedValues << " values]");
  PK_CHECK(values.size(0) <= kMaxCodedValues, what << ": the table holds " << values.size(0)
                                                   << " values, expected at most " << kMaxCodedValues
                                                   << " (one per uint8 code)");
}

/// out[i] = table[codes[i]] for element type T (the table's bits, whatever
/// its dtype), one pass over the codes.
template <typename T>
void gather_as(const uint8_t* codes, const void* table, void* out, int64_t n) {
  const T* t = static_cast<const T*>(table);
  T* o = static_cast<T*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = t[codes[i]];
}

/// Every one of the n codes names an entry of a table of `entries`, or
/// Error naming the largest code.
void check_codes(const uint8_t* codes, int64_t n, int64_t entries, const std::string& what) {
  if (n == 0) return;
  const int64_t largest = *std::max_element(codes, codes + n);
  PK_CHECK(largest < entries, what << ": code " << largest << " is out of range of the table of " << entries
                                   << " values (codes must be in [0, " << entries << "))");
}

/// out[i] = table[codes[i]] for the n codes, in the table's dtype (float64,
/// float32, int64 or int32: 8 or 4 bytes, parse), by element size straight
/// from the uint8 codes, so that no int64 index as large as the array (eight
/// bytes a code) is made on the way. `table` is contiguous.
void decode_into(const uint8_t* codes, int64_t n, const torch::Tensor& table, void* out) {
  PK_ASSERT(table.element_size() == 8 || table.element_size() == 4);
  if (table.element_size() == 8) {
    gather_as<uint64_t>(codes, table.data_ptr(), out, n);
  } else {
    gather_as<uint32_t>(codes, table.data_ptr(), out, n);
  }
}

/// Codes read and decoded a block at a time (read_coded).
constexpr size_t kCodeBlock = size_t{1} << 20;

/// The coded array in the codes file `path` against `values` (checked):
/// the codes read a block at a time, each block checked against the table
/// and decoded into the array, so that neither the file nor its codes are
/// copied whole. `what` names the pair in errors.
/// The layout of the codes file `path`, open as `file`: uint8 codes of the
/// array's shape, at least one dimension. `what` names the pair in errors.
NpyLayout codes_layout(const InFile& file, const std::string& path, const std::string& what) {
  const NpyLayout l = layout_of(file.head(), file.size(), path, true);
  PK_CHECK(!l.shape.empty(), what << ": codes of shape " << c10::IntArrayRef(l.shape) << ", expected the array's "
                                  << "shape (at least one dimension)");
  return l;
}

/// The table of the values file `path`, read and checked before its codes are.
torch::Tensor read_values(const std::string& path) {
  torch::Tensor values = read_npy(path);
  check_values(values, path);
  return values;
}

torch::Tensor read_coded(const std::string& path, const torch::Tensor& values, const std::string& what) {
  const InFile file(path);
  const NpyLayout l = codes_layout(file, path, what);
  const torch::Tensor table = values.contiguous();
  const int64_t entries = table.size(0);
  const size_t esize = static_cast<size_t>(table.element_size());
  torch::Tensor out = empty_for_reading(l.shape, table.scalar_type(), l.data_bytes * esize);  // a byte a code
  std::vector<uint8_t> block(std::min(kCodeBlock, l.data_bytes));
  char* o = static_cast<char*>(out.data_ptr());
  for (size_t at = 0; at < l.data_bytes; at += block.size()) {
    const size_t n = std::min(block.size(), l.data_bytes - at);
    file.read(l.data_offset + at, n, block.data());
    check_codes(block.data(), static_cast<int64_t>(n), entries, what);
    decode_into(block.data(), static_cast<int64_t>(n), table, o + at * esize);
  }
  return out;
}

}  // namespace

torch::Tensor parse_npy(const std::string& bytes, const std::string& what) { return parse(bytes, what, false); }

torch::Tensor parse_npy_codes(const std::string& bytes, const std::string& what) {
  return parse(bytes, what, true);
}

torch::Tensor decode_values(const torch::Tensor& codes, const torch::Tensor& values, const std::string& what) {
  PK_CHECK(codes.scalar_type() == torch::kUInt8,
           what << ": codes of dtype " << codes.scalar_type() << ", expected uint8");
  PK_CHECK(codes.dim() >= 1, what << ": codes of shape " << codes.sizes() << ", expected the array's shape "
                                  << "(at least one dimension)");
  check_values(values, what);
  const torch::Tensor c = codes.contiguous(), table = values.contiguous();
  // Every code names an entry of the table, checked before the array is allocated.
  check_codes(c.data_ptr<uint8_t>(), c.numel(), table.size(0), what);
  torch::Tensor out = torch::empty(codes.sizes(), table.options());
  decode_into(c.data_ptr<uint8_t>(), c.numel(), table, out.data_ptr());
  return out;
}

std::vector<std::string> npy_array_files(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path base(dir);
  const bool plain = fs::exists(base / (name + ".npy"));
  const bool codes = fs::exists(base / (name + ".codes.npy")), values = fs::exists(base / (name + ".values.npy"));
  if (plain) {
    PK_CHECK(!codes && !values, "'" << dir << "' holds both " << name << ".npy and " << name
                                    << (codes ? ".codes.npy" : ".values.npy") << "; expected the array once: "
                                    << name << ".npy, or the pair " << name << ".codes.npy and " << name
                                    << ".values.npy");
    return {name + ".npy"};
  }
  PK_CHECK(codes || values, "'" << dir << "' has no " << name << ".npy (nor the pair " << name << ".codes.npy and "
                                << name << ".values.npy)");
  PK_CHECK(codes && values, "'" << dir << "' holds " << name << (codes ? ".codes.npy but not " : ".values.npy but not ")
                                << name << (codes ? ".values.npy" : ".codes.npy") << "; a coded array is the pair "
                                << name << ".codes.npy (uint8 codes, the array's shape) and " << name
                                << ".values.npy (the table of values, 1-D)");
  return {name + ".codes.npy", name + ".values.npy"};
}

torch::Tensor read_npy_array(const std::string& dir, const std::string& name) {
  const std::vector<std::string> files = npy_array_files(dir, name);
  const std::string first = (std::filesystem::path(dir) / files[0]).string();
  if (files.size() == 1) return read_npy(first);
  const std::string second = (std::filesystem::path(dir) / files[1]).string();
  return read_coded(first, read_values(second), first + " with " + second);
}

CodedArray read_npy_coded(const std::string& dir, const std::string& name) {
  const std::vector<std::string> files = npy_array_files(dir, name);
  PK_CHECK(files.size() == 2, "'" << dir << "' holds " << name << " as " << files[0] << "; expected the pair "
                                  << name << ".codes.npy and " << name << ".values.npy");
  const std::string first = (std::filesystem::path(dir) / files[0]).string();
  const std::string second = (std::filesystem::path(dir) / files[1]).string();
  const std::string what = first + " with " + second;
  CodedArray c;
  c.values = read_values(second);
  const InFile file(first);
  const NpyLayout l = codes_layout(file, first, what);
  c.codes = empty_for_reading(l.shape, torch::kUInt8, l.data_bytes);
  if (l.data_bytes > 0) file.read(l.data_offset, l.data_bytes, c.codes.data_ptr());
  check_codes(c.codes.data_ptr<uint8_t>(), c.codes.numel(), c.values.size(0), what);
  return c;
}

void write_npy(const std::string& path, const torch::Tensor& tensor) { write_npy_file(path, npy_file(tensor)); }

torch::Tensor read_npy(const std::string& path) {
  // Straight from the file into the array: no copy of the file's bytes.
  const InFile file(path);
  const NpyLayout l = layout_of(file.head(), file.size(), path, false);
  torch::Tensor t = empty_for_reading(l.shape, l.dtype, l.data_bytes);
  if (l.data_bytes > 0) file.read(l.data_offset, l.data_bytes, t.data_ptr());
  return t;
}

}  // namespace pathkernel
