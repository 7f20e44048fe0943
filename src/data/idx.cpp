// IDX files (the MNIST family's format) and the "fashion-mnist" dataset built
// from Debian's dataset-fashion-mnist package.
//
// IDX layout: bytes 0-1 are zero, byte 2 is the element type (only 0x08,
// unsigned byte, is supported), byte 3 the number of dimensions (1..4); then
// one big-endian int32 per dimension, then the elements in row-major order.
// Files are read through zlib's gzread, which decompresses gzip files and
// passes plain files through, so both work. Byte offsets in error messages
// count uncompressed bytes.
//
// Fashion-MNIST inputs are pixel bytes; registry.cpp scales them by 1/255 and
// standardises with the scalar mean and std of all train pixels:
// {"kind":"standardize","scale":1/255,"mean":m,"std":s}.
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <sstream>

#include "pathkernel/dataset.h"
#include "pathkernel/error.h"
#include "loaders.h"

namespace pathkernel {

namespace {

constexpr uint8_t kUnsignedByte = 0x08;

/// Owns a gzFile.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : file_(gzopen(path.c_str(), "rb")) {
    PK_CHECK(file_ != nullptr, "cannot open IDX file '" << path << "': " << std::strerror(errno));
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  /// Reads up to n bytes into dst; returns how many were read (fewer only at
  /// the end of the data, including a gzip stream that was cut short).
  int64_t read(uint8_t* dst, int64_t n, const std::string& path) {
    int64_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - got, 1 << 20));
      const int r = gzread(file_, dst + got, chunk);
      if (r < 0) {
        int errnum = 0;
        const char* message = gzerror(file_, &errnum);
        PK_THROW("cannot read IDX file '" << path << "' at byte offset " << position_ + got
                                          << ": " << message);
      }
      if (r == 0) break;
      got += r;
    }
    position_ += got;
    return got;
  }

  int64_t position() const { return position_; }

 private:
  gzFile file_;
  int64_t position_ = 0;
};

std::string hex_byte(unsigned value) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(2) << std::setfill('0') << value;
  return out.str();
}

const char* idx_type_name(uint8_t code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "not an IDX type";
  }
}

std::string shape_string(const std::vector<int64_t>& dims) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < dims.size(); ++i) out << (i ? ", " : "") << dims[i];
  out << "]";
  return out.str();
}

}  // namespace

torch::Tensor read_idx(const std::string& path) {
  PK_CHECK(std::filesystem::is_regular_file(path),
           "cannot open IDX file '" << path << "': no such file");
  GzFile file(path);

  uint8_t magic[4] = {0, 0, 0, 0};
  const int64_t got_magic = file.read(magic, 4, path);
  PK_CHECK(got_magic == 4, "truncated IDX file '" << path << "': data ended at byte offset "
                                                  << got_magic
                                                  << ", expected a 4-byte magic number");
  PK_CHECK(magic[0] == 0 && magic[1] == 0,
           "bad IDX magic number in '" << path << "': found bytes " << hex_byte(magic[0]) << " "
                                       << hex_byte(magic[1]) << " " << hex_byte(magic[2]) << " "
                                       << hex_byte(magic[3]) << ", expected 0x00 0x00 "
                                       << "<type 0x08> <number of dimensions 1..4>");
  PK_CHECK(magic[2] == kUnsignedByte,
           "unsupported IDX element type " << hex_byte(magic[2]) << " (" << idx_type_name(magic[2])
                                           << ") in '" << path
                                           << "': only 0x08 (unsigned byte) is supported");
  const int ndims = magic[3];
  PK_CHECK(ndims >= 1 && ndims <= 4, "bad IDX header in '" << path << "': byte 3 gives " << ndims
                                                           << " dimensions, expected 1 to 4");

  uint8_t raw_dims[16];
  const int64_t header_bytes = 4 + 4 * ndims;
  const int64_t got_dims = file.read(raw_dims, 4 * ndims, path);
  PK_CHECK(got_dims == 4 * ndims, "truncated IDX file '"
                                      << path << "': data ended at byte offset "
                                      << file.position() << ", expected a " << header_bytes
                                      << "-byte header (" << ndims << " dimensions)");
  std::vector<int64_t> dims(ndims);
  int64_t total = 1;
  for (int i = 0; i < ndims; ++i) {
    const uint8_t* b = raw_dims + 4 * i;
    const uint32_t u = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) |
                       uint32_t{b[3]};
    PK_CHECK(u <= 0x7fffffffu, "bad IDX header in '" << path << "': dimension " << i
                                                     << " is negative ("
                                                     << static_cast<int32_t>(u) << ")");
    dims[i] = static_cast<int64_t>(u);
    total = mul_no_overflow(total, dims[i], "IDX element count");
  }

  // Read into a buffer that grows with the data actually read rather than
  // allocating `total` up front, so a corrupt header claiming a huge size
  // (10^12 elements) fails as truncation, not as a huge allocation. Chunks
  // start at 64 KiB and double up to 4 MiB, so a short file costs little.
  std::vector<uint8_t> data;
  int64_t chunk = int64_t{1} << 16;
  while (static_cast<int64_t>(data.size()) < total) {
    const int64_t want = std::min<int64_t>(chunk, total - static_cast<int64_t>(data.size()));
    chunk = std::min<int64_t>(chunk * 2, int64_t{1} << 22);
    const size_t old_size = data.size();
    data.resize(old_size + static_cast<size_t>(want));
    const int64_t got = file.read(data.data() + old_size, want, path);
    data.resize(old_size + static_cast<size_t>(got));
    if (got < want) break;
  }
  PK_CHECK(static_cast<int64_t>(data.size()) == total,
           "truncated IDX file '" << path << "': data ended at byte offset " << file.position()
                                  << ", expected " << header_bytes + total << " bytes ("
                                  << header_bytes << "-byte header + " << total
                                  << " bytes of data for shape " << shape_string(dims) << ")");

  uint8_t extra = 0;
  PK_CHECK(file.read(&extra, 1, path) == 0,
           "IDX file '" << path << "' has data after byte offset " << header_bytes + total
                        << ": the header's shape " << shape_string(dims) << " accounts for "
                        << header_bytes + total << " bytes (a wrong shape or two files joined?)");

  torch::Tensor out = torch::empty(dims, torch::kUInt8);
  if (total > 0) std::memcpy(out.data_ptr<uint8_t>(), data.data(), data.size());
  return out;
}

std::string fashion_mnist_dir() {
  const char* dir = std::getenv("PATHKERNEL_FASHION_MNIST");
  if (dir != nullptr && *dir != '\0') return dir;
  return "/usr/share/datasets/fashion-mnist";
}

namespace detail {

namespace {

/// Reads one images/labels pair: x [n, 1, rows, cols] uint8, y [n] int64.
std::pair<torch::Tensor, torch::Tensor> read_fashion_split(const std::string& images_path,
                                                           const std::string& labels_path) {
  const torch::Tensor images = read_idx(images_path);
  const torch::Tensor labels = read_idx(labels_path);
  PK_CHECK(images.dim() == 3, "Fashion-MNIST images file '"
                                  << images_path << "' has " << images.dim()
                                  << " dimensions, expected 3 (images, rows, columns)");
  PK_CHECK(labels.dim() == 1, "Fashion-MNIST labels file '"
                                  << labels_path << "' has " << labels.dim()
                                  << " dimensions, expected 1");
  PK_CHECK(images.size(0) == labels.size(0),
           "Fashion-MNIST files disagree: '" << images_path << "' holds " << images.size(0)
                                             << " images but '" << labels_path << "' holds "
                                             << labels.size(0) << " labels");
  if (labels.numel() > 0) {
    const int64_t max_label = labels.max().item<int64_t>();
    PK_CHECK(max_label < 10, "Fashion-MNIST labels file '" << labels_path << "' holds label "
                                                           << max_label
                                                           << ", expected labels in [0, 10)");
  }
  return {images.unsqueeze(1), labels.to(torch::kLong)};
}

}  // namespace

Dataset load_fashion_mnist(const std::string& /*argument*/, uint64_t /*seed*/) {
  const std::string dir = fashion_mnist_dir();
  const char* names[4] = {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"};
  std::vector<std::string> files;
  for (const char* name : names) {
    const std::string path = dir + "/" + name;
    PK_CHECK(std::filesystem::is_regular_file(path),
             "Fashion-MNIST file not found: '"
                 << path << "'. Install it with `apt-get install dataset-fashion-mnist` (or run "
                 << "`make deps`), or set PATHKERNEL_FASHION_MNIST to a directory holding "
                 << names[0] << ", " << names[1] << ", " << names[2] << " and " << names[3]);
    files.push_back(path);
  }
  Dataset data;
  std::tie(data.x_train, data.y_train) = read_fashion_split(files[0], files[1]);
  std::tie(data.x_test, data.y_test) = read_fashion_split(files[2], files[3]);
  PK_CHECK(data.x_train.sizes().slice(1) == data.x_test.sizes().slice(1),
           "Fashion-MNIST train images are " << data.x_train.size(2) << "x"
                                             << data.x_train.size(3) << " but test images are "
                                             << data.x_test.size(2) << "x" << data.x_test.size(3));
  data.input_shape = {1, data.x_train.size(2), data.x_train.size(3)};
  data.num_classes = 10;
  data.normalization = {{"kind", "standardize"}, {"scale", 1.0 / 255.0}};
  data.source = {{"files", files}};
  return data;
}

}  // namespace detail
}  // namespace pathkernel
