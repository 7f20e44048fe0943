// Locating kinks in t: Brent's root finder, the closed-form crossings of
// affine pre-activations, and merging of break points.
#include "pathkernel/quadrature.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "pathkernel/error.h"

namespace pathkernel {

namespace {

/// One step of Brent's method from the best estimate b, the previous one a
/// and the bracket's other end c (their values fa, fb, fc), with the
/// half-bracket m and tolerance tol: sets the step d (and e, the step
/// before), interpolating where that is safe and bisecting otherwise.
void brent_step(double a, double b, double c, double fa, double fb, double fc, double m, double tol, double& d,
                double& e) {
  if (std::fabs(e) >= tol && std::fabs(fa) > std::fabs(fb)) {
    // Interpolate: secant when only two points are distinct, else inverse quadratic.
    const double s = fb / fa;
    double p, q;
    if (a == c) {
      p = 2 * m * s;
      q = 1 - s;
    } else {
      const double qa = fa / fc, r = fb / fc;
      p = s * (2 * m * qa * (qa - r) - (b - a) * (r - 1));
      q = (qa - 1) * (r - 1) * (s - 1);
    }
    if (p > 0) {
      q = -q;
    } else {
      p = -p;
    }
    // Accept the step only if it stays well inside the bracket and shrinks
    // faster than the step before last; otherwise bisect.
    if (2 * p < 3 * m * q - std::fabs(tol * q) && p < std::fabs(0.5 * e * q)) {
      e = d;
      d = p / q;
    } else {
      d = m;
      e = m;
    }
  } else {
    d = m;
    e = m;
  }
}

}  // namespace

double find_root(const std::function<double(double)>& g, double a, double b, int* evaluations) {
  PK_CHECK(std::isfinite(a) && std::isfinite(b) && a <= b,
           "find_root: bad interval [" << a << ", " << b << "]: expected finite ends with a <= b");
  int count = 0;
  auto eval = [&](double t) {
    const double v = g(t);
    ++count;
    PK_CHECK(std::isfinite(v), "find_root: g(" << t << ") = " << v << ": expected a finite value");
    return v;
  };
  struct Counter {  // reports the count however find_root returns
    int* out;
    const int& count;
    ~Counter() {
      if (out) *out = count;
    }
  } counter{evaluations, count};

  double fa = eval(a);
  if (fa == 0.0) return a;
  double fb = eval(b);
  if (fb == 0.0) return b;
  PK_CHECK((fa < 0.0) != (fb < 0.0), "find_root: no sign change on [" << a << ", " << b << "]: g(" << a
                                                                      << ") = " << fa << ", g(" << b
                                                                      << ") = " << fb);

  // Brent (1973), "zeroin". b is the best estimate, [b, c] (in either order)
  // brackets the sign change, a is the previous b. With the unit roundoff u,
  // the loop stops when |c − b| <= 4u|b| (+ a tiny absolute floor), which is
  // at most 4 ulp of b.
  const double u = std::numeric_limits<double>::epsilon() / 2;
  const double floor_tol = 4 * std::numeric_limits<double>::denorm_min();
  double c = a, fc = fa;
  double d = b - a, e = d;
  for (int iter = 0; iter < 10000; ++iter) {
    if ((fb > 0.0) == (fc > 0.0)) {  // keep the sign change between b and c
      c = a;
      fc = fa;
      d = e = b - a;
    }
    if (std::fabs(fc) < std::fabs(fb)) {  // b is the end with the smaller |g|
      a = b;
      b = c;
      c = a;
      fa = fb;
      fb = fc;
      fc = fa;
    }
    const double tol = 2 * u * std::fabs(b) + 0.5 * floor_tol;
    const double m = 0.5 * (c - b);
    if (std::fabs(m) <= tol || fb == 0.0) return b;
    brent_step(a, b, c, fa, fb, fc, m, tol, d, e);
    a = b;
    fa = fb;
    b += std::fabs(d) > tol ? d : (m > 0 ? tol : -tol);
    fb = eval(b);
  }
  PK_ASSERT(false && "find_root did not converge");
  return b;
}

std::vector<double> affine_crossings(const std::vector<double>& p0, const std::vector<double>& p1) {
  PK_CHECK(p0.size() == p1.size(), "affine_crossings: p0 has " << p0.size() << " units but p1 has "
                                                               << p1.size());
  std::vector<double> crossings;
  for (size_t u = 0; u < p0.size(); ++u) {
    PK_CHECK(std::isfinite(p0[u]) && std::isfinite(p1[u]),
             "affine_crossings: unit " << u << " has a non-finite pre-activation (" << p0[u] << " at t = 0, "
                                       << p1[u] << " at t = 1)");
    if ((p0[u] < 0.0 && p1[u] > 0.0) || (p0[u] > 0.0 && p1[u] < 0.0)) {
      // Opposite signs: |p0 − p1| >= |p0| even after rounding, so t is in
      // [0,1]. In long double the difference is (nearly always) exact and t
      // is rounded to double once.
      const long double a = p0[u];
      const double t = static_cast<double>(a / (a - p1[u]));
      if (t > 0.0 && t < 1.0) crossings.push_back(t);
    }
  }
  std::sort(crossings.begin(), crossings.end());
  crossings.erase(std::unique(crossings.begin(), crossings.end()), crossings.end());
  return crossings;
}

std::vector<double> breakpoints(std::vector<double> points, double min_gap) {
  PK_CHECK(std::isfinite(min_gap) && min_gap >= 0.0,
           "breakpoints: bad min_gap " << min_gap << ": expected a finite value >= 0");
  points.erase(std::remove_if(points.begin(), points.end(),
                              [](double t) { return !(t > 0.0 && t < 1.0); }),  // also drops NaN
               points.end());
  std::sort(points.begin(), points.end());
  std::vector<double> breaks{0.0};
  for (double t : points) {
    if (t - breaks.back() < min_gap || t == breaks.back() || 1.0 - t < min_gap) continue;
    breaks.push_back(t);
  }
  breaks.push_back(1.0);
  return breaks;
}

}  // namespace pathkernel
