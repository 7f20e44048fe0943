// The arithmetic of a decomposition's test side and training side, counted
// from the network's layer shapes: what `verify --json` reports beside the
// seconds, so that a user (and the bench) can read the cost against the
// machine's floor.
//
// Counted are the layers' products (Linear, Conv1d, Conv2d), in floating-point
// operations (2 per multiply-add); elementwise work (activations, masks,
// normalisation, embeddings' look-ups) is not. A row along a segment
// evaluates each product at W_s and at dW_s; a cotangent walked back forms
// each product's weight gradient and, from the second product on, its input
// gradient (at W_s and at dW_s). Where a piece's first two layers come from
// pairs of cotangents on layer 1 (QuadratureCounts::pair_pieces), its rows'
// cotangents stop at layer 1 (short_cotangent_flop), each piece takes layer
// 1 forward on one row (pair_piece_flop), and each test point's sums take
// layer 1's input gradient and, for a convolution, its weight gradient
// (pair_sum_flop per cotangent).
//
// The training side is counted too: every step's batch at w_s, each row's
// forward pass at W_s, its loss signal walked back (each product's input
// gradient from the second on) and each product's weight gradient (a
// convolution's per sample from its patches, a Linear layer's in the batch's
// mean gradient), for one walk of the path.
#pragma once

#include <optional>

#include <torch/torch.h>

#include "pathkernel/decomposition.h"
#include "pathkernel/features.h"
#include "pathkernel/manifest.h"
#include "pathkernel/segment.h"

namespace pathkernel {

/// Floating-point operations of one row of the test side.
struct RowArithmetic {
  double forward_flop = 0;    ///< one row's forward pass along the segment
  double cotangent_flop = 0;  ///< one cotangent walked back through one row
  double short_cotangent_flop = 0;  ///< one cotangent walked back to param layer 1 alone
  double pair_piece_flop = 0;       ///< a piece's pair: layer 1 forward on one row at W_s and dW_s
  double pair_sum_flop = 0;         ///< one cotangent of a test point's summed pair through layer 1
  double training_row_flop = 0;     ///< one training row's signals and weight gradients at w_s

  /// The test side's operations for quadrature counts `c` (summed over
  /// points and steps) of a network with K outputs: integrand rows take a
  /// forward pass and K cotangents, moment rows one, forward-only rows none;
  /// of those cotangents, the short ones stop at layer 1 and the unwalked
  /// ones take nothing; the pairs take their own.
  double test_side_flop(const QuadratureCounts& c, int64_t K) const;

  /// The training side's operations in one walk of the run's path: every
  /// step's batch (batch_size rows, or every training point for full-batch
  /// runs) at training_row_flop. A reverse walk in several chunks of test
  /// points (their accumulators beyond --memory) forms it once per chunk.
  double training_side_flop(const Manifest& m) const;
};

/// The row arithmetic of ev's network on rows shaped like `example`
/// [1, *input_shape]; nullopt on the generic route, whose layers pathkernel
/// does not see. Sets ev's segment (to w = 0, dw = 0).
std::optional<RowArithmetic> row_arithmetic(SegmentEvaluator& ev, const torch::Tensor& example);

/// The row arithmetic of the run's network as decompose() evaluates it with
/// `options`, on rows shaped like x's first.
std::optional<RowArithmetic> row_arithmetic(PathReader& reader, const DecompositionOptions& options,
                                            const torch::Tensor& x);

}  // namespace pathkernel
