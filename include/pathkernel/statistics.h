// The statistics the attribution metrics report: ranks with ties averaged,
// Pearson and Spearman correlation, and the area under the ROC curve.
// Plain loops in float64 over std::vector<double>; every function checks its
// input and throws Error naming what was wrong.
#pragma once

#include <vector>

namespace pathkernel {

/// Ranks 1..n of v, ties given the mean of the ranks they span
/// (e.g. {10, 20, 20, 30} -> {1, 2.5, 2.5, 4}). v must be finite.
std::vector<double> average_ranks(const std::vector<double>& v);

/// Pearson correlation of a and b (equal sizes >= 2, finite). NaN when either
/// is constant (the correlation is undefined).
double pearson(const std::vector<double>& a, const std::vector<double>& b);

/// Spearman correlation: Pearson of the average ranks. NaN when either is constant.
double spearman(const std::vector<double>& a, const std::vector<double>& b);

/// Area under the ROC curve of `scores` ranking the `positive` items first:
/// the probability that a random positive scores above a random negative,
/// ties counting one half (the Mann–Whitney U statistic over n_pos · n_neg).
/// Needs at least one positive and one negative; scores finite.
double roc_auc(const std::vector<double>& scores, const std::vector<bool>& positive);

/// Mean of the finite values of v (NaN when there are none): averages of
/// per-test-point correlations skip the undefined ones.
double mean_finite(const std::vector<double>& v);

/// Median of the finite values of v (the mean of the middle two for an even
/// count; NaN when there are none).
double median_finite(const std::vector<double>& v);

/// The least-squares slope of y on x through the origin, Σ x y / Σ x²: how
/// many units y moves per unit of x (NaN when x is all zero). Sizes equal, finite.
double slope_through_origin(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace pathkernel
