// Gauss–Legendre rules: nodes and weights by Newton's method on the Legendre
// recurrence in long double, cached by n, mapped to [a,b] on request.
#include "pathkernel/quadrature.h"

#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

constexpr int kMaxGaussNodes = 10000;

// The lower half of the n-point rule, on [0,1]: nodes h_i = (1 + x_i)/2 for
// the Legendre roots x_i < 0 (ascending) and their weights w_i/2. For odd n
// the middle node is 1/2 with weight `middle_weight`. The upper half is the
// mirror image, 1 − h_i, which keeps the rule exactly symmetric.
struct HalfRule {
  std::vector<long double> nodes;
  std::vector<long double> weights;
  long double middle_weight = 0.0L;  // odd n only
};

// P_n(x) and P_n'(x) by the three-term recurrence. |x| < 1.
void legendre(int n, long double x, long double* p, long double* dp) {
  long double p_prev = 1.0L;  // P_0
  long double p_cur = x;      // P_1
  for (int k = 2; k <= n; ++k) {
    const long double p_next = ((2 * k - 1) * x * p_cur - (k - 1) * p_prev) / k;
    p_prev = p_cur;
    p_cur = p_next;
  }
  *p = p_cur;
  // (1 − x²) P_n' = n (P_{n−1} − x P_n); (1 − x)(1 + x) keeps accuracy near ±1.
  *dp = n * (p_prev - x * p_cur) / ((1.0L - x) * (1.0L + x));
}

// Weight on [0,1] of the node at Legendre root x: 1 / ((1 − x²) P_n'(x)²).
long double weight_at(int n, long double x) {
  long double p = 0.0L, dp = 0.0L;
  legendre(n, x, &p, &dp);
  return 1.0L / ((1.0L - x) * (1.0L + x) * dp * dp);
}

HalfRule compute_half_rule(int n) {
  const long double pi = 3.141592653589793238462643383279502884L;
  const long double eps = std::numeric_limits<long double>::epsilon();
  HalfRule rule;
  const int half = n / 2;
  rule.nodes.resize(half);
  rule.weights.resize(half);
  for (int i = 0; i < half; ++i) {
    // The i-th largest root, from Tricomi's approximation; Newton from there
    // converges to it, not to a neighbour (the ascending-order check below
    // would catch a root found twice).
    const long double theta = pi * (i + 0.75L) / (n + 0.5L);
    long double x = (1.0L - (n - 1.0L) / (8.0L * n * n * n)) * std::cos(theta);
    for (int iter = 0; iter < 100; ++iter) {
      long double p = 0.0L, dp = 0.0L;
      legendre(n, x, &p, &dp);
      const long double dx = p / dp;
      x -= dx;
      if (std::fabs(dx) <= 4 * eps) break;
    }
    // Mirror: the lower-half node is −x, at (1 − x)/2 on [0,1].
    PK_ASSERT(x > 0.0L && x < 1.0L);
    rule.nodes[i] = (1.0L - x) / 2.0L;
    rule.weights[i] = weight_at(n, x);
  }
  if (n % 2 == 1) rule.middle_weight = weight_at(n, 0.0L);
  for (int i = 1; i < half; ++i) PK_ASSERT(rule.nodes[i] > rule.nodes[i - 1]);
  return rule;
}

std::shared_ptr<const HalfRule> cached_half_rule(int n) {
  static std::mutex mutex;
  static std::map<int, std::shared_ptr<const HalfRule>> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(n);
    if (it != cache.end()) return it->second;
  }
  auto rule = std::make_shared<const HalfRule>(compute_half_rule(n));  // outside the lock
  std::lock_guard<std::mutex> lock(mutex);
  return cache.emplace(n, std::move(rule)).first->second;
}

}  // namespace

QuadratureRule gauss_legendre(int n, double a, double b) {
  PK_CHECK(n >= 1 && n <= kMaxGaussNodes,
           "Gauss-Legendre: bad number of nodes " << n << ": expected an integer in [1, "
                                                  << kMaxGaussNodes << "]");
  PK_CHECK(std::isfinite(a) && std::isfinite(b) && a < b,
           "Gauss-Legendre: bad interval [" << a << ", " << b
                                            << "]: expected finite ends with a < b");
  const auto half = cached_half_rule(n);
  const long double lo = a, hi = b, width = hi - lo;
  const int m = static_cast<int>(half->nodes.size());
  QuadratureRule rule;
  rule.nodes.resize(n);
  rule.weights.resize(n);
  for (int i = 0; i < m; ++i) {
    // Each half is measured from its own end, so nodes near either end keep
    // their relative accuracy.
    rule.nodes[i] = static_cast<double>(lo + width * half->nodes[i]);
    rule.nodes[n - 1 - i] = static_cast<double>(hi - width * half->nodes[i]);
    rule.weights[i] = rule.weights[n - 1 - i] = static_cast<double>(width * half->weights[i]);
  }
  if (n % 2 == 1) {
    rule.nodes[m] = static_cast<double>(lo + width / 2.0L);
    rule.weights[m] = static_cast<double>(width * half->middle_weight);
  }
  return rule;
}

}  // namespace pathkernel
