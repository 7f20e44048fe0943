// The certified integrator: pieces, their rules, the certificate test and
// the refinement of failed pieces.
#include "pathkernel/integrator.h"

#include <algorithm>
#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

QuadratureOptions QuadratureOptions::for_run(int64_t steps) const {
  QuadratureOptions q = *this;
  if (run_tol > 0) q.tol = run_tol / static_cast<double>(std::max<int64_t>(1, steps));
  return q;
}

QuadratureRule fixed_rule(const QuadratureSpec& spec) {
  PK_ASSERT(spec.kind != QuadratureSpec::Kind::Gauss);
  return spec.kind == QuadratureSpec::Kind::Dpk ? left_point() : riemann(spec.nodes);
}

int64_t adaptive_nodes(const QuadratureOptions& q, double h) {
  const double n_h = std::ceil(q.gauss_nodes * std::sqrt(h));
  return static_cast<int64_t>(std::clamp<double>(n_h, std::min(q.min_nodes, q.gauss_nodes), q.gauss_nodes));
}

int64_t nodes_for(const QuadratureOptions& q, const Piece& pc, int64_t exact) {
  const int64_t adaptive = adaptive_nodes(q, pc.b - pc.a);
  if (exact <= 0) return adaptive;
  return pc.full ? exact : std::min(adaptive, exact);
}

int64_t logit_nodes(int64_t m) { return (m + 1) / 2; }
int64_t moment_nodes(int64_t m) { return m < 2 ? 0 : m % 2 ? m / 2 : m / 2 + 1; }

bool split_pays(int64_t m, int64_t outputs) {
  return logit_nodes(m) * (outputs + 1) + 2 * moment_nodes(m) < m * (outputs + 1);
}

namespace {

/// Lays out piece p's node rows, ends and `extra` moment rows in `rd`.
void lay_out_piece(PieceRound& rd, const Piece& pc, int64_t p, int64_t extra) {
  const QuadratureRule& rule = gauss_legendre(static_cast<int>(rd.first[p + 1] - rd.first[p]), 0.0, 1.0);
  for (int64_t j = 0, r = rd.first[p]; r < rd.first[p + 1]; ++j, ++r) {
    rd.point[r] = pc.point;
    rd.piece_of[r] = p;
    rd.t[r] = pc.a + (pc.b - pc.a) * rule.nodes[j];
    rd.w[r] = (pc.b - pc.a) * rule.weights[j];
  }
  rd.end_point[2 * p] = rd.end_point[2 * p + 1] = pc.point;
  rd.ends[2 * p] = pc.a;
  rd.ends[2 * p + 1] = pc.b;
  if (extra > 0) {
    for (double u : gauss_legendre(static_cast<int>(extra), 0.0, 1.0).nodes) {
      rd.mpoint.push_back(pc.point);
      rd.mpiece_of.push_back(p);
      rd.mt.push_back(pc.a + (pc.b - pc.a) * u);
    }
  }
  rd.mfirst.push_back(rd.mfirst.back() + extra);
}

}  // namespace

PieceRound next_round(std::vector<Piece>& pending, std::vector<Piece>& next, const QuadratureOptions& q,
                      int64_t max_rows, int64_t exact_nodes, int64_t split_outputs) {
  PieceRound rd;
  rd.first = {0};
  std::vector<int64_t> moments;  // per piece: its moment nodes
  int64_t taken = 0;
  for (const Piece& pc : pending) {
    const int64_t m = nodes_for(q, pc, exact_nodes);
    const bool split = split_outputs > 0 && split_pays(m, split_outputs);
    const int64_t nodes = split ? logit_nodes(m) : m, extra = split ? moment_nodes(m) : 0;
    if (rd.first.size() > 1 && taken + nodes + extra > max_rows) break;
    taken += nodes + extra;
    rd.first.push_back(rd.first.back() + nodes);
    moments.push_back(extra);
  }
  rd.np = static_cast<int64_t>(rd.first.size()) - 1;
  next.assign(pending.begin() + rd.np, pending.end());
  pending.resize(rd.np);
  rd.rows = rd.first[rd.np];
  rd.point.resize(rd.rows);
  rd.piece_of.resize(rd.rows);
  rd.t.resize(rd.rows);
  rd.w.resize(rd.rows);
  rd.end_point.resize(2 * rd.np);
  rd.ends.resize(2 * rd.np);
  rd.mfirst = {0};
  for (int64_t p = 0; p < rd.np; ++p) lay_out_piece(rd, pending[p], p, moments[p]);
  rd.moment_rows = rd.mfirst.back();
  return rd;
}

void split(const Piece& pc, double gap, const std::vector<double>& cuts, std::vector<Piece>& out) {
  double last = pc.a;
  for (double c : cuts) {
    if (c - last > kMinPiece && pc.b - c > kMinPiece) {
      out.push_back({pc.point, last, c, pc.depth + 1, gap});
      last = c;
    }
  }
  if (last == pc.a) {
    const double mid = 0.5 * (pc.a + pc.b);
    out.push_back({pc.point, pc.a, mid, pc.depth + 1, gap});
    last = mid;
  }
  out.push_back({pc.point, last, pc.b, pc.depth + 1, gap});
}

bool piece_accepted(const QuadratureOptions& q, const Piece& pc, double gap, double scale) {
  // The tolerance shares tol * scale over [0,1] by length, with a floor
  // for the rounding of f(b) - f(a) itself.
  const double limit = std::max(q.tol * (pc.b - pc.a), 8 * kMachineEps) * scale;
  // A gap at rounding level that splitting no longer halves is the
  // rounding of the forward pass, not quadrature error: accept it, up to
  // 16 ε of the scale, and up to 64 ε from kStuckDepth splits on. A gap of
  // tens of ε that one split leaves is often an error a further split
  // removes: on the user CNN of docs/measurements.md, the pieces accepted
  // at once up to 64 ε made half of its worst test point's error.
  const double rounding_level = (pc.depth >= kStuckDepth ? 64 : 16) * kMachineEps * scale;
  const bool rounding = gap <= rounding_level && gap > 0.5 * pc.parent_gap;
  return gap <= limit || rounding || pc.depth >= q.max_depth;
}

namespace {

/// The first pieces of every test point: [0,1] split at its initial kinks.
std::vector<Piece> initial_pieces(Integrand& f) {
  const std::vector<std::vector<double>> cuts = f.initial_kinks();
  PK_ASSERT(static_cast<int64_t>(cuts.size()) == f.points());
  std::vector<Piece> pending;
  for (int64_t i = 0; i < f.points(); ++i) {
    const std::vector<double> br = breakpoints(cuts[i], kMinPiece);
    for (size_t j = 0; j + 1 < br.size(); ++j) pending.push_back({i, br[j], br[j + 1], 0});
  }
  return pending;
}

/// Pieces of a test point that may fail without a kink found inside them
/// (halved or retried) in one integration before it is an error. A kink the
/// search misses fails one piece a halving, at most max_depth; pieces split
/// at kinks found are progress and not counted. A certificate that cannot
/// close (test features that disagree with the network along the segment)
/// fails every piece of every halving, doubling the pieces each round up to
/// 2^max_depth: ended here with an error instead.
constexpr int64_t kMaxKinklessFailures = int64_t{1} << 14;

/// The error for test point i, whose certificate did not close.
[[noreturn]] void certificate_did_not_close(int64_t i, const Piece& pc, double gap, double scale,
                                            const QuadratureOptions& q) {
  PK_THROW("test point " << i << ": its certificate did not close after " << kMaxKinklessFailures
                         << " pieces of one segment failed without a kink inside (the last, [" << pc.a << ", " << pc.b
                         << "] at depth " << pc.depth << ", is " << gap << " from f(b) - f(a), "
                         << "against a tolerance of " << q.tol << " of the scale " << scale
                         << " by length): either the test features disagree with the network along the "
                         << "segment, a defect of pathkernel (please report it with the run), or the segment "
                         << "crosses more kinks than halving its pieces can isolate");
}

/// Refines a round's failed pieces into `next`: at the kinks inside each,
/// else (no kink, fewer than the exact nodes) once more with all of them,
/// else at its midpoint; counts each point's failures without a kink in
/// `kinkless` (at most kMaxKinklessFailures).
void refine(Integrand& f, const QuadratureOptions& q, const PieceRound& rd, const std::vector<Piece>& pending,
            const std::vector<int64_t>& failed, const std::vector<double>& gap, const std::vector<double>& scale,
            std::vector<Piece>& next, std::vector<int64_t>& kinkless) {
  if (failed.empty()) return;
  const std::vector<std::vector<double>> cuts = f.kinks_in(rd, failed);
  PK_ASSERT(cuts.size() == failed.size());
  const int64_t exact = f.exact_nodes();
  for (size_t i = 0; i < failed.size(); ++i) {
    Piece pc = pending[failed[i]];
    const double g = gap[failed[i]];
    if (cuts[i].empty() && ++kinkless[static_cast<size_t>(pc.point)] > kMaxKinklessFailures) {
      certificate_did_not_close(pc.point, pc, g, scale[static_cast<size_t>(pc.point)], q);
    }
    if (cuts[i].empty() && nodes_for(q, pc, exact) < exact) {
      pc.full = true;
      pc.parent_gap = g;
      next.push_back(pc);
    } else {
      split(pc, g, cuts[i], next);
    }
  }
}

}  // namespace

std::vector<std::vector<double>> integrate(Integrand& f, const QuadratureOptions& q) {
  std::vector<std::vector<double>> breaks(f.points(), std::vector<double>{0.0, 1.0});
  if (q.spec.kind != QuadratureSpec::Kind::Gauss) {
    f.integrate_fixed(fixed_rule(q.spec));
    return breaks;
  }
  std::vector<Piece> pending = initial_pieces(f);
  const std::vector<double> scale = f.scales();
  std::vector<int64_t> kinkless(static_cast<size_t>(f.points()), 0);  // refine's count
  while (!pending.empty()) {
    std::vector<Piece> next;
    const PieceRound rd = next_round(pending, next, q, f.max_rows(), f.exact_nodes(), f.split_outputs());
    const std::vector<double> gap = f.certificate_gaps(rd);
    PK_ASSERT(static_cast<int64_t>(gap.size()) == rd.np);
    std::vector<int64_t> accepted, failed;
    for (int64_t p = 0; p < rd.np; ++p) {
      const Piece& pc = pending[p];
      if (piece_accepted(q, pc, gap[p], scale[pc.point])) {
        accepted.push_back(p);
        breaks[pc.point].push_back(pc.a);
        breaks[pc.point].push_back(pc.b);
      } else {
        failed.push_back(p);
      }
    }
    refine(f, q, rd, pending, failed, gap, scale, next, kinkless);
    if (!accepted.empty()) f.accept(rd, accepted);
    pending = std::move(next);
  }
  for (std::vector<double>& b : breaks) {
    std::sort(b.begin(), b.end());
    b.erase(std::unique(b.begin(), b.end()), b.end());
  }
  return breaks;
}

}  // namespace pathkernel
