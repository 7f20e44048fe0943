// The composite Gauss–Legendre, Riemann and left-point rules, and the
// --quadrature spec ("gauss", "riemann:T", "dpk").
#include "pathkernel/quadrature.h"

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {
constexpr int kMaxRiemannNodes = 100000;
constexpr const char kSpecNames[] = "gauss, riemann:T, dpk";
}  // namespace

QuadratureRule composite_gauss_legendre(int n, const std::vector<double>& breaks) {
  PK_CHECK(breaks.size() >= 2, "composite Gauss-Legendre: expected at least 2 breaks (got "
                                   << breaks.size() << ")");
  for (size_t k = 0; k < breaks.size(); ++k) {
    PK_CHECK(std::isfinite(breaks[k]),
             "composite Gauss-Legendre: break " << k << " is " << breaks[k] << ": expected a finite value");
    PK_CHECK(k == 0 || breaks[k - 1] < breaks[k],
             "composite Gauss-Legendre: breaks must be strictly ascending (break "
                 << k - 1 << " = " << breaks[k - 1] << ", break " << k << " = " << breaks[k] << ")");
  }
  QuadratureRule rule;
  rule.nodes.reserve((breaks.size() - 1) * static_cast<size_t>(std::max(n, 0)));
  rule.weights.reserve(rule.nodes.capacity());
  for (size_t k = 0; k + 1 < breaks.size(); ++k) {
    QuadratureRule piece = gauss_legendre(n, breaks[k], breaks[k + 1]);
    rule.nodes.insert(rule.nodes.end(), piece.nodes.begin(), piece.nodes.end());
    rule.weights.insert(rule.weights.end(), piece.weights.begin(), piece.weights.end());
  }
  return rule;
}

QuadratureRule riemann(int T) {
  PK_CHECK(T >= 1, "Riemann rule: bad number of nodes " << T << ": expected T >= 1");
  QuadratureRule rule;
  rule.nodes.resize(T);
  rule.weights.assign(T, 1.0 / T);
  for (int j = 0; j < T; ++j) rule.nodes[j] = static_cast<double>(j) / T;  // correctly rounded j/T
  return rule;
}

QuadratureRule left_point() { return QuadratureRule{{0.0}, {1.0}}; }

QuadratureSpec QuadratureSpec::parse(const std::string& text) {
  QuadratureSpec spec;
  if (text == "gauss") {
    spec.kind = Kind::Gauss;
    return spec;
  }
  if (text == "dpk") {
    spec.kind = Kind::Dpk;
    return spec;
  }
  const std::string riemann_prefix = "riemann:";
  PK_CHECK(text != "riemann", "quadrature 'riemann' needs a node count: use riemann:T, where T must be "
                              "an integer in [1, "
                                  << kMaxRiemannNodes << "]");
  PK_CHECK(text.compare(0, riemann_prefix.size(), riemann_prefix) == 0,
           "unknown quadrature '" << text << "': expected one of " << kSpecNames);
  const std::string value = text.substr(riemann_prefix.size());
  // Digits only (no sign, no spaces), and short enough not to overflow.
  bool digits = !value.empty() && value.size() <= 9;
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  const int T = digits ? std::stoi(value) : -1;
  PK_CHECK(T >= 1 && T <= kMaxRiemannNodes, "quadrature '" << text << "': bad node count '" << value
                                                           << "': T must be an integer in [1, "
                                                           << kMaxRiemannNodes << "]");
  spec.kind = Kind::Riemann;
  spec.nodes = T;
  return spec;
}

std::string QuadratureSpec::str() const {
  switch (kind) {
    case Kind::Gauss: return "gauss";
    case Kind::Riemann: return "riemann:" + std::to_string(nodes);
    case Kind::Dpk: return "dpk";
  }
  PK_ASSERT(false);
  return "";
}

}  // namespace pathkernel
