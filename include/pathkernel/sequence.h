// Sequence outputs: a data set whose labels are integer arrays [n, T] (a
// token at every position, as for a language model) is a sequence data set.
// Its module maps an example to outputs [T, V] (V: the vocabulary), its
// training point is a whole sequence, and its loss the mean over the
// sequence's T tokens (loss.h). The test side decomposes the V outputs at one
// position t (default: the last, T − 1), so the engine sees [n, V] there
// like any classifier's [n, K].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace pathkernel {

/// Whether labels y are a sequence's tokens: integer [n, T].
inline bool is_sequence_labels(const torch::Tensor& y) {
  return y.defined() && y.dim() == 2 && !y.is_floating_point();
}

/// The position `position` (−1: the last) of a sequence of length T, checked:
/// throws Error naming `what` (e.g. "--position"), the value and the range.
int64_t resolve_position(int64_t position, int64_t sequence_length, const std::string& what = "--position");

/// Outputs at one position: f [n, T, V] -> f[:, t, :] [n, V] (t −1: the
/// last). Outputs [n, K] of a model that is not a sequence model are
/// returned as they are.
torch::Tensor at_position(const torch::Tensor& f, int64_t position);

/// Labels at one position: y [n, T] -> y[:, t] [n] (t −1: the last); other
/// labels as they are.
torch::Tensor labels_at_position(const torch::Tensor& y, int64_t position);

/// The text of one example's integer codes x [*] (any shape, read row-major):
/// the vocabulary's strings joined, "?" for a code it does not name; "" when
/// the vocabulary is empty.
std::string sequence_text(const torch::Tensor& x, const std::vector<std::string>& vocabulary);

}  // namespace pathkernel
