// Ranks, correlations and ROC AUC for the attribution metrics.
#include "pathkernel/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

void check_finite(const std::vector<double>& v, const char* what) {
  for (size_t i = 0; i < v.size(); ++i) {
    PK_CHECK(std::isfinite(v[i]), what << ": value " << i << " is " << v[i] << ", expected a finite number");
  }
}

void check_pair(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  PK_CHECK(a.size() == b.size(), what << ": the two samples differ in size (" << a.size() << " and " << b.size()
                                      << ")");
  PK_CHECK(a.size() >= 2, what << ": needs at least 2 pairs (got " << a.size() << ")");
  check_finite(a, what);
  check_finite(b, what);
}

double pearson_unchecked(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= n;
  mb /= n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (a[i] - ma) * (b[i] - mb);
    saa += (a[i] - ma) * (a[i] - ma);
    sbb += (b[i] - mb) * (b[i] - mb);
  }
  if (saa == 0 || sbb == 0) return std::numeric_limits<double>::quiet_NaN();
  return sab / std::sqrt(saa * sbb);
}

}  // namespace

std::vector<double> average_ranks(const std::vector<double>& v) {
  check_finite(v, "ranks");
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
  std::vector<double> ranks(v.size());
  for (size_t start = 0; start < order.size();) {
    size_t end = start + 1;
    while (end < order.size() && v[order[end]] == v[order[start]]) ++end;
    // Positions start..end-1 hold ranks start+1..end; each gets their mean.
    const double mean_rank = 0.5 * static_cast<double>(start + 1 + end);
    for (size_t k = start; k < end; ++k) ranks[order[k]] = mean_rank;
    start = end;
  }
  return ranks;
}

double pearson(const std::vector<double>& a, const std::vector<double>& b) {
  check_pair(a, b, "pearson");
  return pearson_unchecked(a, b);
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  check_pair(a, b, "spearman");
  return pearson_unchecked(average_ranks(a), average_ranks(b));
}

double roc_auc(const std::vector<double>& scores, const std::vector<bool>& positive) {
  PK_CHECK(scores.size() == positive.size(), "roc_auc: " << scores.size() << " scores but " << positive.size()
                                                         << " labels");
  check_finite(scores, "roc_auc");
  const std::vector<double> ranks = average_ranks(scores);
  double n_pos = 0, rank_sum = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    if (positive[i]) {
      n_pos += 1;
      rank_sum += ranks[i];
    }
  }
  const double n_neg = static_cast<double>(scores.size()) - n_pos;
  PK_CHECK(n_pos >= 1 && n_neg >= 1, "roc_auc: needs at least one positive and one negative (got "
                                         << n_pos << " positives and " << n_neg << " negatives)");
  // Mann–Whitney: U = rank sum of the positives minus its least value.
  const double u = rank_sum - n_pos * (n_pos + 1) / 2;
  return u / (n_pos * n_neg);
}

double mean_finite(const std::vector<double>& v) {
  double sum = 0;
  int64_t n = 0;
  for (double x : v) {
    if (std::isfinite(x)) {
      sum += x;
      ++n;
    }
  }
  return n == 0 ? std::numeric_limits<double>::quiet_NaN() : sum / static_cast<double>(n);
}

double median_finite(const std::vector<double>& v) {
  std::vector<double> f;
  for (double x : v) {
    if (std::isfinite(x)) f.push_back(x);
  }
  if (f.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(f.begin(), f.end());
  const size_t h = f.size() / 2;
  return f.size() % 2 == 1 ? f[h] : 0.5 * (f[h - 1] + f[h]);
}

double slope_through_origin(const std::vector<double>& x, const std::vector<double>& y) {
  PK_CHECK(x.size() == y.size(), "slope: the two samples differ in size (" << x.size() << " and " << y.size() << ")");
  check_finite(x, "slope");
  check_finite(y, "slope");
  double xy = 0, xx = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    xy += x[i] * y[i];
    xx += x[i] * x[i];
  }
  return xx == 0 ? std::numeric_limits<double>::quiet_NaN() : xy / xx;
}

}  // namespace pathkernel
