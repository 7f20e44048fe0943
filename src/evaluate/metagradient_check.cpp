// The metagradient against retraining (metagradient_check.h).
#include "pathkernel/metagradient_check.h"

#include <chrono>
#include <cmath>

#include "pathkernel/error.h"

namespace pathkernel {

std::vector<int64_t> strongest_points(const Metagradient& g, int64_t count) {
  const torch::Tensor size = torch::nan_to_num(g.values, 0.0).abs().sum(torch::IntArrayRef{0, 2});  // [M]
  const torch::Tensor idx = std::get<1>(size.topk(std::min<int64_t>(count, size.size(0))));
  return std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel());
}

MetagradientCheck check_metagradient(PathReader& reader, const torch::Tensor& x, const Metagradient& g,
                                     const std::vector<int64_t>& points, const MetagradientCheckOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t M = reader.manifest().num_train;
  PK_CHECK(!points.empty(), "metagradient check: no training points given");
  PK_CHECK(std::isfinite(options.h) && options.h > 0, "metagradient check: the step h must be > 0 (got "
                                                          << options.h << ")");
  for (int64_t i : points) {
    PK_CHECK(i >= 0 && i < M, "metagradient check: training point " << i << " is not in [0, " << M << ")");
  }
  const torch::Tensor base =
      reader.loss_weights().defined() ? reader.loss_weights() : torch::ones({M}, torch::kFloat64);
  std::vector<RetrainJob> jobs;
  for (int64_t i : points) {
    for (double step : {options.h, options.h / 2}) {
      for (double sign : {1.0, -1.0}) {
        RetrainJob job;
        job.weights = base.clone();
        job.weights[i] += sign * step;  // below 0 for a point of weight 0: the loss is smooth in c_i there too
        jobs.push_back(job);
      }
    }
  }
  const torch::Tensor f = Retrainer(reader).outputs(jobs, x, options.retrain);  // [4·points, n, K]
  std::vector<torch::Tensor> est, spread;
  for (size_t j = 0; j < points.size(); ++j) {
    const torch::Tensor d_h = (f[4 * j] - f[4 * j + 1]) / (2 * options.h);
    const torch::Tensor d_half = (f[4 * j + 2] - f[4 * j + 3]) / options.h;
    est.push_back((4 * d_half - d_h) / 3);
    spread.push_back((d_half - d_h).abs());
  }
  MetagradientCheck c;
  c.points = points;
  c.metagradient = g.values.index_select(1, torch::tensor(points, torch::kLong));
  c.differences = torch::stack(est, 1);
  c.spread = torch::stack(spread, 1);
  const torch::Tensor known = ~torch::isnan(c.metagradient);
  const double scale = c.differences.masked_select(known).abs().max().item<double>();
  c.max_rel_error = (c.metagradient - c.differences).masked_select(known).abs().max().item<double>() / scale;
  c.max_rel_spread = c.spread.masked_select(known).max().item<double>() / scale;
  c.retrainings = static_cast<int64_t>(jobs.size());
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

MetagradientCheckEntry check_entry(const MetagradientCheck& c, double h) {
  MetagradientCheckEntry entry;
  entry.h = h;
  entry.max_rel_error = c.max_rel_error;
  entry.max_rel_spread = c.max_rel_spread;
  entry.retrainings = c.retrainings;
  entry.seconds = c.seconds;
  for (size_t j = 0; j < c.points.size(); ++j) {
    const torch::Tensor known = ~torch::isnan(c.metagradient.select(1, static_cast<int64_t>(j)));
    const torch::Tensor mg = c.metagradient.select(1, static_cast<int64_t>(j)).masked_select(known);
    const torch::Tensor fd = c.differences.select(1, static_cast<int64_t>(j)).masked_select(known).contiguous();
    entry.points.push_back({c.points[j], std::vector<double>(mg.data_ptr<double>(), mg.data_ptr<double>() + mg.numel()),
                            std::vector<double>(fd.data_ptr<double>(), fd.data_ptr<double>() + fd.numel())});
  }
  return entry;
}

}  // namespace pathkernel
