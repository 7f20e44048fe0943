// Reading and writing NumPy .npy (format version 1.0).
#include "pathkernel/npy.h"

#include <cstring>
#include <regex>

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
    default: PK_THROW("cannot write dtype " << dtype << " to .npy: expected float64, float32, int64 or int32");
  }
}

torch::Dtype dtype_of(const std::string& descr, const std::string& what) {
  if (descr == "<f8") return torch::kFloat64;
  if (descr == "<f4") return torch::kFloat32;
  if (descr == "<i8") return torch::kInt64;
  if (descr == "<i4") return torch::kInt32;
  PK_THROW(what << ": unsupported .npy dtype '" << descr << "': expected <f8, <f4, <i8 or <i4");
}
}  // namespace

std::string npy_bytes(const torch::Tensor& tensor) {
  torch::Tensor t = tensor.detach().contiguous().cpu();
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
  size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  out.append(static_cast<const char*>(t.data_ptr()), nbytes);
  return out;
}

torch::Tensor parse_npy(const std::string& bytes, const std::string& what) {
  PK_CHECK(bytes.size() >= 10 && std::memcmp(bytes.data(), kMagic, 6) == 0,
           what << ": not a .npy file (bad magic; expected \\x93NUMPY)");
  unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    offset = 10;
  } else {
    PK_CHECK(major == 2 || major == 3, what << ": unsupported .npy version " << major);
    PK_CHECK(bytes.size() >= 12, what << ": truncated .npy header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    offset = 12;
  }
  PK_CHECK(bytes.size() >= offset + header_len,
           what << ": truncated .npy header (file has " << bytes.size() << " bytes, header needs "
                << offset + header_len << ")");
  std::string header = bytes.substr(offset, header_len);
  std::smatch m;
  PK_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']*)'")),
           what << ": .npy header has no 'descr'");
  torch::Dtype dtype = dtype_of(m[1], what);
  PK_CHECK(std::regex_search(header, m, std::regex("'fortran_order':\\s*(True|False)")) &&
               m[1] == "False",
           what << ": .npy file must be C order (fortran_order False)");
  PK_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")),
           what << ": .npy header has no 'shape'");
  std::vector<int64_t> shape;
  std::string dims = m[1];
  std::regex num("[0-9]+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    shape.push_back(std::stoll(it->str()));
  }
  int64_t numel = 1;
  for (int64_t d : shape) numel = mul_no_overflow(numel, d, ".npy element count");
  size_t esize = torch::elementSize(dtype);
  size_t data_offset = offset + header_len;
  size_t need = static_cast<size_t>(mul_no_overflow(numel, static_cast<int64_t>(esize), ".npy byte count"));
  PK_CHECK(bytes.size() - data_offset == need,
           what << ": .npy data has " << bytes.size() - data_offset << " bytes, expected " << need
                << " for shape (" << dims << ")");
  torch::Tensor t = torch::empty(shape, torch::TensorOptions().dtype(dtype));
  std::memcpy(t.data_ptr(), bytes.data() + data_offset, need);
  return t;
}

void write_npy(const std::string& path, const torch::Tensor& tensor) {
  write_file_atomic(path, npy_bytes(tensor));
}

torch::Tensor read_npy(const std::string& path) { return parse_npy(read_file(path), path); }

}  // namespace pathkernel
