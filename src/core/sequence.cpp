// Sequence outputs at one position (sequence.h).
#include "pathkernel/sequence.h"

#include "pathkernel/error.h"

namespace pathkernel {

int64_t resolve_position(int64_t position, int64_t sequence_length, const std::string& what) {
  PK_CHECK(sequence_length >= 1, what << " " << position << ": the data are not sequences (their labels are not "
                                      << "integer tokens [n, T]); positions are for sequence data sets");
  PK_CHECK(position >= -1 && position < sequence_length,
           what << " " << position << " is out of range: the sequences have " << sequence_length
                << " positions, expected 0 .. " << sequence_length - 1 << " (or -1: the last)");
  return position < 0 ? sequence_length - 1 : position;
}

torch::Tensor at_position(const torch::Tensor& f, int64_t position) {
  if (f.dim() != 3) return f;
  return f.select(1, resolve_position(position, f.size(1), "position"));
}

torch::Tensor labels_at_position(const torch::Tensor& y, int64_t position) {
  if (!is_sequence_labels(y)) return y;
  return y.select(1, resolve_position(position, y.size(1), "position"));
}

std::string sequence_text(const torch::Tensor& x, const std::vector<std::string>& vocabulary) {
  if (vocabulary.empty()) return "";
  const torch::Tensor codes = x.reshape({-1}).to(torch::kLong).contiguous();
  std::string text;
  const int64_t* c = codes.data_ptr<int64_t>();
  for (int64_t i = 0; i < codes.numel(); ++i) {
    const bool named = c[i] >= 0 && c[i] < static_cast<int64_t>(vocabulary.size());
    text += named ? vocabulary[c[i]] : "?";
  }
  return text;
}

}  // namespace pathkernel
