#include "pathkernel/pieced_linear.h"

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

namespace pathkernel {

PieceRange piece_range(int64_t size, int64_t pieces, int64_t p) {
  const int64_t base = size / pieces, extra = size % pieces;
  return {p * base + std::min(p, extra), base + (p < extra ? 1 : 0)};
}

namespace {

/// Runs piece(p) for every piece, over LibTorch's threads (each piece's
/// operations then on its own thread alone), each with the caller's
/// thread-local state: its grad mode above all (an autograd Function's
/// forward runs without gradients, and the pieces' out= products refuse
/// inputs that need them where gradients are on).
template <typename Piece>
void for_pieces(int64_t pieces, const Piece& piece) {
  const at::ThreadLocalState caller;
  at::parallel_for(0, pieces, 1, [&](int64_t p0, int64_t p1) {
    const at::ThreadLocalStateGuard state(caller);
    for (int64_t p = p0; p < p1; ++p) piece(p);
  });
}

/// y = x·wᵀ + b by rows of x, written into y's rows.
torch::Tensor forward_pieces(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                             int64_t pieces) {
  torch::Tensor y = torch::empty({x.size(0), w.size(0)}, x.options());
  const torch::Tensor wt = w.t();
  for_pieces(pieces, [&](int64_t p) {
    const PieceRange r = piece_range(x.size(0), pieces, p);
    if (r.count == 0) return;
    torch::Tensor out = y.narrow(0, r.first, r.count);
    if (b.defined()) {
      at::addmm_out(out, b, x.narrow(0, r.first, r.count), wt);
    } else {
      at::mm_out(out, x.narrow(0, r.first, r.count), wt);
    }
  });
  return y;
}

/// The gradients of y = x·wᵀ + b for y's gradient g [B, out], by pieces:
/// dx = g·w by rows of the batch; dw = gᵀ·x and db = Σ_rows g by output
/// units. Only those asked for.
struct LinearGradients {
  torch::Tensor dx, dw, db;
};

LinearGradients gradient_pieces(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& w,
                                bool want_x, bool want_w, bool want_b, int64_t pieces) {
  LinearGradients out;
  if (want_x) out.dx = torch::empty_like(x, torch::MemoryFormat::Contiguous);
  if (want_w) out.dw = torch::empty_like(w, torch::MemoryFormat::Contiguous);
  if (want_b) out.db = torch::empty({w.size(0)}, w.options());
  for_pieces(pieces, [&](int64_t p) {
    if (want_x) {
      const PieceRange r = piece_range(x.size(0), pieces, p);
      if (r.count > 0) {
        torch::Tensor dx = out.dx.narrow(0, r.first, r.count);
        at::mm_out(dx, g.narrow(0, r.first, r.count), w);
      }
    }
    const PieceRange u = piece_range(w.size(0), pieces, p);
    if (u.count == 0) return;
    const torch::Tensor gu = g.narrow(1, u.first, u.count);
    if (want_w) {
      torch::Tensor dw = out.dw.narrow(0, u.first, u.count);
      at::mm_out(dw, gu.t(), x);
    }
    if (want_b) {
      torch::Tensor db = out.db.narrow(0, u.first, u.count);
      at::sum_out(db, gu, {0});
    }
  });
  return out;
}

/// The same gradients as operations autograd records (a graph of the
/// gradients asked for: create_graph), each piece's product its own and the
/// pieces joined.
LinearGradients gradient_pieces_recorded(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& w,
                                         bool want_x, bool want_w, bool want_b, int64_t pieces) {
  std::vector<torch::Tensor> dx, dw, db;
  for (int64_t p = 0; p < pieces; ++p) {
    const PieceRange r = piece_range(x.size(0), pieces, p), u = piece_range(w.size(0), pieces, p);
    if (want_x && r.count > 0) dx.push_back(torch::mm(g.narrow(0, r.first, r.count), w));
    if (u.count == 0) continue;
    const torch::Tensor gu = g.narrow(1, u.first, u.count);
    if (want_w) dw.push_back(torch::mm(gu.t(), x));
    if (want_b) db.push_back(gu.sum(0));
  }
  LinearGradients out;
  if (want_x) out.dx = torch::cat(dx);
  if (want_w) out.dw = torch::cat(dw);
  if (want_b) out.db = torch::cat(db);
  return out;
}

struct PiecedLinear : torch::autograd::Function<PiecedLinear> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, int64_t pieces) {
    ctx->save_for_backward({x, w});
    ctx->saved_data["pieces"] = pieces;
    const bool bias = b.numel() > 0;
    ctx->saved_data["bias"] = bias;
    return forward_pieces(x, w, bias ? b : torch::Tensor(), pieces);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const int64_t pieces = ctx->saved_data["pieces"].toInt();
    const bool bias = ctx->saved_data["bias"].toBool();
    const torch::Tensor g = grad[0].contiguous();
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1),
               want_b = bias && ctx->needs_input_grad(2);
    const LinearGradients d = torch::GradMode::is_enabled()
                                  ? gradient_pieces_recorded(g, saved[0], saved[1], want_x, want_w, want_b, pieces)
                                  : gradient_pieces(g, saved[0], saved[1], want_x, want_w, want_b, pieces);
    return {d.dx, d.dw, d.db, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor pieced_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b, int64_t pieces) {
  if (pieces <= 1 || x.dim() < 2) return torch::linear(x, w, b);
  // A custom Function's tensor arguments must be defined: no bias is an
  // empty one, told apart by its size.
  const torch::Tensor bias = b.defined() ? b : torch::empty({0}, w.options());
  if (x.dim() == 2) return PiecedLinear::apply(x, w, bias, pieces);
  // [..., in]: every leading index a row of one [rows, in] product.
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return PiecedLinear::apply(x.reshape({-1, x.size(-1)}), w, bias, pieces).view(shape);
}

}  // namespace pathkernel
