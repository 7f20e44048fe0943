// explain, verify and gram across the ranks of a job, split by test points
// (across_ranks.h).
#include "pathkernel/across_ranks.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>

#include "pathkernel/decomposition_checkpoint.h"
#include "pathkernel/error.h"
#include "pathkernel/features.h"
#include "pathkernel/segment.h"

namespace pathkernel {

namespace fs = std::filesystem;

namespace {

/// A decomposition of no test points, for a rank whose share is empty.
Decomposition empty_decomposition(const Manifest& m, bool kernel) {
  const int64_t M = m.num_train, K = m.num_classes;
  Decomposition d;
  d.f0 = torch::zeros({0, K}, torch::kFloat64);
  d.fN = d.f0;
  d.fN_run = d.f0;
  d.contributions = torch::zeros({0, M, K}, torch::kFloat64);
  d.regularization = d.f0;
  d.rounding = d.f0;
  d.gap_abs = d.f0;
  if (kernel) d.kernel = torch::zeros({0, M, K, K}, torch::kFloat64);
  if (m.stores_module_buffers()) d.statistics = d.f0;  // BatchNorm's term S
  d.steps = m.steps;
  return d;
}

std::vector<int64_t> to_vector(const torch::Tensor& idx) {
  const torch::Tensor c = idx.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

void check_indices(const std::string& set, const torch::Tensor& idx, int64_t size, const char* side) {
  PK_CHECK(set == "train" || set == "test",
           "Gram matrix " << side << ": point set '" << set << "', expected train or test");
  PK_CHECK(idx.defined() && idx.dim() == 1 && idx.scalar_type() == torch::kLong && idx.size(0) >= 1,
           "the " << set << " points of a Gram matrix must be a non-empty int64 vector of indices");
  for (int64_t i : to_vector(idx)) {
    PK_CHECK(i >= 0 && i < size, set << " index " << i << " is out of range [0, " << size << ")");
  }
}

/// Whether the ranks split the steps instead of the test points: fewer
/// blocks of test points than ranks, a forward walk (gd, sgd), whose
/// blocks of steps are independent, and more than one block of steps.
bool split_steps(const Communicator& comm, const Manifest& m, int64_t n, int64_t block,
                 const DecompositionOptions& options) {
  return comm.size() > 1 && (n + block - 1) / block < comm.size() && !m.optimizer.traits().has_buffer &&
         !options.reverse && m.checkpoints.size() > 2;
}

/// This rank's blocks of steps (step_blocks(): `bounds`, the run's
/// checkpoint steps) when the ranks split the steps: blocks [begin, end), a
/// contiguous share balanced by their numbers of steps.
Share block_share(const Communicator& comm, const std::vector<int64_t>& bounds) {
  std::vector<double> steps;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) steps.push_back(static_cast<double>(bounds[k + 1] - bounds[k]));
  return share_of(comm, steps);
}

/// The counters of every rank's `d` on `out`: evaluations, forward and
/// moment evaluations, kinks and the time split summed, the certificate gap and
/// the seconds the maximum (a collective: every rank calls it).
void reduce_counters(const Communicator& comm, const Decomposition& d, Decomposition& out) {
  out.certificate_max_gap = comm.max(d.certificate_max_gap);
  out.evaluations = comm.sum(d.evaluations);
  out.forward_evaluations = comm.sum(d.forward_evaluations);
  out.moment_evaluations = comm.sum(d.moment_evaluations);
  out.kinks = comm.sum(d.kinks);
  out.short_cotangents = comm.sum(d.short_cotangents);
  out.unwalked_cotangents = comm.sum(d.unwalked_cotangents);
  out.pair_pieces = comm.sum(d.pair_pieces);
  out.pair_sums = comm.sum(d.pair_sums);
  // Every rank takes the longest rank's sites (a rank whose points crossed
  // no kink at a deep site has a shorter list).
  const auto sites = static_cast<size_t>(comm.max(static_cast<double>(d.kinks_by_site.size())));
  out.kinks_by_site.assign(sites, 0);
  for (size_t i = 0; i < sites; ++i) out.kinks_by_site[i] = comm.sum(i < d.kinks_by_site.size() ? d.kinks_by_site[i] : 0);
  out.seconds = comm.max(d.seconds);
  const auto summed = [&comm](double value) {
    double total = 0;
    for (double v : comm.all_gather(value)) total += v;
    return total;
  };
  out.time_split.test_features = summed(d.time_split.test_features);
  out.time_split.training_signals = summed(d.time_split.training_signals);
  out.time_split.contraction = summed(d.time_split.contraction);
  out.time_split.replay = summed(d.time_split.replay);
  out.time_split.replay_ahead = summed(d.time_split.replay_ahead);
}

/// The tensors add_step_block() adds, in a fixed order.
std::vector<torch::Tensor*> summed_tensors(Decomposition& d) {
  std::vector<torch::Tensor*> t = {&d.contributions, &d.regularization, &d.rounding, &d.gap_abs};
  if (d.kernel.defined()) t.push_back(&d.kernel);
  if (d.statistics.defined()) t.push_back(&d.statistics);
  return t;
}

/// The step split's sums, the same bits as one process's walk: `base` is
/// this rank's decomposition of no steps (f(w_0), f(w_N), zeros), `block(k)`
/// block k's decomposition alone (a range of one block of step_blocks()),
/// called for each block of this rank's share in order. Rank 0 adds its
/// blocks to zeros as they come (add_step_block); every other rank, once its
/// blocks are done, receives the running total from the rank before it, adds
/// its blocks in order and passes the total on, so that every block is added
/// in block order, as one walk adds them; the last rank sends the total to
/// rank 0. A rank other than 0 holds its blocks' sums until the total
/// reaches it when `hold`, or else calls block(k) a second time then (with
/// again = true: explain reads the block back from its saved progress). The
/// counters are summed, the certificate gap is the maximum and the residuals
/// are merged in rank order, that is in step order. Returns the whole on
/// rank 0 and this rank's counters elsewhere; with `rank_seconds`, every
/// rank's time decomposing its blocks, in rank order.
Decomposition sum_blocks(const Communicator& comm, Decomposition base, Share blocks,
                         const std::function<Decomposition(int64_t k, bool again)>& block, bool hold,
                         std::vector<double>* rank_seconds = nullptr) {
  Decomposition local = base;  // this rank's: counters, and on rank 0 the running total
  local.steps = 0;
  std::vector<Decomposition> held;
  for (int64_t k = blocks.begin; k < blocks.end; ++k) {
    Decomposition p = block(k, false);
    local.add_counts(p);
    local.steps += p.steps;
    local.seconds += p.seconds;
    local.time_split.add(p.time_split);
    local.certificate_max_gap = std::max(local.certificate_max_gap, p.certificate_max_gap);
    local.residuals.merge(p.residuals);
    if (comm.root()) add_step_block(local, p);
    else if (hold) held.push_back(std::move(p));
  }
  // The running total along the ranks.
  if (!comm.root()) {
    for (torch::Tensor* t : summed_tensors(local)) comm.receive(*t, comm.rank() - 1);
    for (int64_t k = blocks.begin; k < blocks.end; ++k) {
      add_step_block(local, hold ? held[static_cast<size_t>(k - blocks.begin)] : block(k, true));
    }
    held.clear();
  }
  if (comm.size() > 1) {  // to the next rank; from the last, to rank 0
    const int next = comm.rank() + 1 < comm.size() ? comm.rank() + 1 : 0;
    for (torch::Tensor* t : summed_tensors(local)) comm.send(*t, next);
  }
  if (comm.root() && comm.size() > 1) {
    for (torch::Tensor* t : summed_tensors(local)) comm.receive(*t, comm.size() - 1);
  }
  if (rank_seconds) *rank_seconds = comm.all_gather(local.seconds);
  Decomposition out = local;
  reduce_counters(comm, local, out);
  out.steps = comm.sum(local.steps);
  // Each rank found its own steps' residuals: merged in rank order, that is
  // in step order, as one walk finds them.
  const StepResiduals& r = local.residuals;
  const std::vector<double> max_ratio = comm.all_gather(r.max_ratio), max_residual = comm.all_gather(r.max_residual),
                            bound = comm.all_gather(r.bound),
                            worst = comm.all_gather(static_cast<double>(r.worst_step)),
                            first = comm.all_gather(static_cast<double>(r.first_step)),
                            over = comm.all_gather(static_cast<double>(r.steps_over)),
                            branches = comm.all_gather(r.rounding_branches ? 1.0 : 0.0);
  out.residuals = StepResiduals();
  for (size_t k = 0; k < max_ratio.size(); ++k) {
    StepResiduals rank;
    rank.max_ratio = max_ratio[k];
    rank.max_residual = max_residual[k];
    rank.bound = bound[k];
    rank.worst_step = static_cast<int64_t>(worst[k]);
    rank.first_step = static_cast<int64_t>(first[k]);
    rank.steps_over = static_cast<int64_t>(over[k]);
    rank.rounding_branches = branches[k] > 0;
    out.residuals.merge(rank);
  }
  return out;
}

/// The decomposition of no steps: f(w_0), f(w_N) and zeros (a range [0, 0)).
Decomposition no_steps(PathReader& reader, const torch::Tensor& x, DecompositionOptions o) {
  o.first_step = 0;
  o.end_step = 0;
  o.progress = false;
  return decompose(reader, x, o);
}

}  // namespace

std::vector<double> estimate_point_costs(const Communicator& comm, PathReader& reader, const torch::Tensor& x,
                                         const QuadratureOptions& quadrature) {
  const int64_t n = x.size(0);
  std::vector<double> costs(static_cast<size_t>(n), 1.0);
  const Manifest& m = reader.manifest();
  if (comm.size() == 1 || quadrature.spec.kind != QuadratureSpec::Kind::Gauss || m.checkpoints.size() < 2) {
    return costs;
  }
  // This rank's strided part: points rank, rank + size, ...
  torch::Tensor mine = torch::arange(comm.rank(), n, comm.size(), torch::kLong);
  torch::Tensor local = torch::zeros({mine.size(0)}, torch::kFloat64);
  if (mine.size(0) > 0) {
    Network net64 = engine_network(m.network_options());
    SegmentEvaluator ev(net64, quadrature.route);
    const torch::Tensor w0 = reader.checkpoint(0);
    ev.set_segment(w0, reader.checkpoint(1) - w0);
    const TestFeatures f = test_features(ev, x.index_select(0, mine).to(torch::kFloat64), quadrature);
    for (int64_t j = 0; j < mine.size(0); ++j) {
      // Pieces of the certified rule: each costs about the same evaluations.
      local[j] = static_cast<double>(std::max<size_t>(1, f.breaks[static_cast<size_t>(j)].size() - 1));
    }
  }
  // Gathered in rank order they are the points rank by rank; put them back.
  torch::Tensor gathered = comm.gather_rows(local);
  torch::Tensor order = comm.gather_rows(mine);
  std::string bytes;
  if (comm.root()) {
    torch::Tensor all = torch::empty({n}, torch::kFloat64);
    all.index_copy_(0, order, gathered);
    bytes.assign(static_cast<const char*>(all.data_ptr()), static_cast<size_t>(n) * sizeof(double));
  }
  bytes = comm.broadcast(bytes);
  std::memcpy(costs.data(), bytes.data(), bytes.size());
  return costs;
}

Share share_of(const Communicator& comm, const std::vector<double>& costs, int64_t block) {
  PK_CHECK(block >= 1, "share_of: the block must be >= 1 (got " << block << ")");
  const int64_t n = static_cast<int64_t>(costs.size());
  std::vector<double> block_costs(static_cast<size_t>((n + block - 1) / block), 0.0);
  for (int64_t i = 0; i < n; ++i) block_costs[static_cast<size_t>(i / block)] += costs[static_cast<size_t>(i)];
  const std::vector<int64_t> bounds = split_by_cost(block_costs, comm.size());
  const size_t r = static_cast<size_t>(comm.rank());
  return {std::min(bounds[r] * block, n), std::min(bounds[r + 1] * block, n)};
}

Decomposition gather_decomposition(const Communicator& comm, const Decomposition& d) {
  if (comm.size() == 1) return d;
  Decomposition out;
  out.f0 = comm.gather_rows(d.f0);
  out.fN = comm.gather_rows(d.fN);
  out.fN_run = comm.gather_rows(d.fN_run);
  out.contributions = comm.gather_rows(d.contributions);
  out.regularization = comm.gather_rows(d.regularization);
  out.rounding = comm.gather_rows(d.rounding);
  out.gap_abs = comm.gather_rows(d.gap_abs);
  if (d.kernel.defined()) out.kernel = comm.gather_rows(d.kernel);
  if (d.statistics.defined()) out.statistics = comm.gather_rows(d.statistics);
  reduce_counters(comm, d, out);
  out.steps = d.steps;
  // The steps' residuals do not depend on the test points: every rank that
  // walked the path found the same, and a rank without points found none.
  const StepResiduals& r = d.residuals;
  out.residuals.max_ratio = comm.max(r.max_ratio);
  out.residuals.max_residual = comm.max(r.max_residual);
  out.residuals.bound = comm.max(r.bound);
  out.residuals.worst_step = static_cast<int64_t>(comm.max(static_cast<double>(r.worst_step)));
  out.residuals.steps_over = static_cast<int64_t>(comm.max(static_cast<double>(r.steps_over)));
  const double first = comm.max(r.first_step >= 0 ? -static_cast<double>(r.first_step) : -1e300);
  out.residuals.first_step = first > -1e299 ? static_cast<int64_t>(-first) : -1;
  // Every rank that found steps over their bound read them against its replay alike.
  out.residuals.rounding_branches = out.residuals.steps_over > 0 &&
                                    comm.max(r.steps_over > 0 && !r.rounding_branches ? 1.0 : 0.0) == 0;
  return comm.root() ? out : d;
}

Decomposition decompose_across(const Communicator& comm, PathReader& reader, const torch::Tensor& x,
                               const DecompositionOptions& options) {
  if (comm.size() == 1) return decompose(reader, x, options);
  const Manifest& m = reader.manifest();
  const int64_t block = decomposition_block(reader, x, options);
  DecompositionOptions local = options;
  local.progress = options.progress && comm.root();
  if (split_steps(comm, m, x.size(0), block, options)) {
    const std::vector<int64_t> bounds = step_blocks(m);
    const auto one_block = [&](int64_t k, bool) {
      DecompositionOptions o = local;
      o.first_step = bounds[static_cast<size_t>(k)];
      o.end_step = bounds[static_cast<size_t>(k) + 1];
      return decompose(reader, x, o);
    };
    return sum_blocks(comm, no_steps(reader, x, local), block_share(comm, bounds), one_block, true);
  }
  const Share share = share_of(comm, estimate_point_costs(comm, reader, x, options.quadrature), block);
  const Decomposition d = share.size() > 0 ? decompose(reader, x.narrow(0, share.begin, share.size()), local)
                                           : empty_decomposition(reader.manifest(), options.kernel);
  return gather_decomposition(comm, d);
}

ExplainAcross explain_across(const Communicator& comm, PathReader& reader, const torch::Tensor& test_index,
                             const std::string& out, const ExplainOptions& options) {
  ExplainAcross r;
  Explanation& e = r.explanation;
  if (comm.size() == 1) {
    e = explain(reader, test_index, out, options);
    r.rank_seconds = {e.decomposition.seconds};
    r.rank_points = {test_index.size(0)};
    return r;
  }
  comm.agree([&] {
    check_explain_indices(reader, test_index, options);
    PK_CHECK(!options.by_layer, "explain --by-layer runs in one process (got " << comm.size()
                                    << " ranks): run it without mpirun");
  });
  const Manifest& m = reader.manifest();
  const int64_t n = test_index.size(0);
  const DecompositionOptions dopt = explain_decomposition_options(m, n, options, &e.kernel_note);
  if (comm.root() && options.on_note && !e.kernel_note.empty()) options.on_note(e.kernel_note);
  const torch::Tensor x = reader.test_inputs(test_index);
  const int64_t block = decomposition_block(reader, x, dopt);
  // Each rank its points; or, with few points, every point on every rank and each rank its blocks of steps.
  const bool by_steps = split_steps(comm, m, n, block, dopt);
  DecompositionOptions local_options = dopt;
  local_options.progress = dopt.progress && comm.root();
  const auto note = [&](const std::string& message) {
    if (options.on_note && !message.empty()) options.on_note("rank " + std::to_string(comm.rank()) + ": " + message);
  };
  Decomposition whole;
  if (by_steps) {
    // Each block of steps saves its progress to OUT/.progress/steps-A-B
    // (whatever the number of ranks), and its sums once it is done: a rerun
    // continues it, and the running total reads it back from there.
    const std::vector<int64_t> bounds = step_blocks(m);
    const nlohmann::ordered_json arguments = explain_progress_arguments(reader, test_index, dopt);
    const auto one_block = [&](int64_t k, bool again) {
      const int64_t a = bounds[static_cast<size_t>(k)], b = bounds[static_cast<size_t>(k) + 1];
      nlohmann::ordered_json args = arguments;
      args["steps"] = {a, b};
      const std::string dir =
          (fs::path(out) / ".progress" / ("steps-" + std::to_string(a) + "-" + std::to_string(b))).string();
      DirectoryCheckpoint progress(dir, args, options.checkpoint_seconds);
      const DecompositionProgress* saved = progress.resume_point();
      if (!again) {
        note(progress.message());
        if (e.progress_note.empty()) e.progress_note = progress.message();
      }
      DecompositionOptions o = local_options;
      o.first_step = a;
      o.end_step = b;
      o.progress = local_options.progress && !again;
      Decomposition d = decompose(reader, x, o, &progress);
      if (saved == nullptr || saved->steps_done != b) {  // the block's sums, kept for the running total and a rerun
        DecompositionProgress done;
        done.chunk = n;
        done.chunk_start = 0;
        done.steps_done = b;
        done.partial = d;
        progress.save(done);
      }
      return d;
    };
    whole = sum_blocks(comm, no_steps(reader, x, dopt), block_share(comm, bounds), one_block, false, &r.rank_seconds);
    r.rank_points.assign(static_cast<size_t>(comm.size()), n);
  } else {
    const Share share = share_of(comm, estimate_point_costs(comm, reader, x, dopt.quadrature), block);
    Decomposition local = empty_decomposition(m, dopt.kernel);
    if (share.size() > 0) {
      const torch::Tensor mine = test_index.narrow(0, share.begin, share.size());
      nlohmann::ordered_json arguments = explain_progress_arguments(reader, mine, dopt);
      arguments["rank"] = comm.rank();
      arguments["ranks"] = comm.size();
      const std::string dir = (fs::path(out) / ".progress" /
                               ("rank-" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size())))
                                  .string();
      DirectoryCheckpoint progress(dir, arguments, options.checkpoint_seconds);
      progress.resume_point();
      e.progress_note = progress.message();
      note(e.progress_note);
      local = decompose(reader, x.narrow(0, share.begin, share.size()), local_options, &progress);
    }
    r.rank_seconds = comm.all_gather(local.seconds);
    for (double p : comm.all_gather(static_cast<double>(share.size()))) {
      r.rank_points.push_back(static_cast<int64_t>(p));
    }
    whole = gather_decomposition(comm, local);
  }
  // The root writes; every rank learns whether it could.
  comm.agree([&] {
    if (!comm.root()) return;
    write_explanation(reader, test_index, out, dopt, options, std::move(whole), e);
    std::error_code ec;
    fs::remove_all(fs::path(out) / ".progress", ec);
  });
  e.dir = out;
  return r;
}

namespace {

/// A set of retrainings as the root sends it: a JSON header line (options,
/// number of jobs and training points, which jobs have a keep mask or
/// labels), then each job's keep mask (M bytes) and labels (M int64s) where
/// present. An empty message ends serve_retrainings().
std::string retrain_message(const std::vector<RetrainJob>& jobs, int64_t M, const RetrainOptions& o) {
  nlohmann::json head{{"work_file", o.work_file},
                      {"label", o.label},
                      {"scaling", removal_scaling_name(o.scaling)},
                      {"workers", o.workers},
                      {"threads_per_retrain", o.threads_per_retrain},
                      {"save_seconds", o.save_seconds},
                      {"train", M},
                      {"jobs", jobs.size()}};
  std::string body;
  for (const RetrainJob& job : jobs) {
    head["keep"].push_back(job.keep.defined());
    head["labels"].push_back(job.labels.defined());
    if (job.keep.defined()) {
      const torch::Tensor k = job.keep.to(torch::kUInt8).contiguous();
      body.append(static_cast<const char*>(k.data_ptr()), static_cast<size_t>(M));
    }
    if (job.labels.defined()) {
      const torch::Tensor l = job.labels.to(torch::kLong).contiguous();
      body.append(static_cast<const char*>(l.data_ptr()), static_cast<size_t>(M) * sizeof(int64_t));
    }
  }
  return head.dump() + "\n" + body;
}

/// The jobs and options of retrain_message().
std::vector<RetrainJob> read_retrain_message(const std::string& message, RetrainOptions& o) {
  const size_t end = message.find('\n');
  PK_CHECK(end != std::string::npos, "retraining: a malformed message from the root");
  const nlohmann::json head = nlohmann::json::parse(message.substr(0, end));
  o.work_file = head.at("work_file").get<std::string>();
  o.label = head.at("label").get<std::string>();
  o.scaling = parse_removal_scaling(head.at("scaling").get<std::string>());
  o.workers = head.at("workers").get<int>();
  o.threads_per_retrain = head.at("threads_per_retrain").get<int>();
  o.save_seconds = head.at("save_seconds").get<double>();
  const int64_t M = head.at("train").get<int64_t>();
  const size_t J = head.at("jobs").get<size_t>();
  std::vector<RetrainJob> jobs(J);
  size_t at = end + 1;
  auto take = [&](size_t bytes) {
    PK_CHECK(at + bytes <= message.size(), "retraining: a truncated message from the root");
    const char* p = message.data() + at;
    at += bytes;
    return p;
  };
  for (size_t j = 0; j < J; ++j) {
    if (head.at("keep").at(j).get<bool>()) {
      jobs[j].keep = torch::empty({M}, torch::kUInt8);
      std::memcpy(jobs[j].keep.data_ptr(), take(static_cast<size_t>(M)), static_cast<size_t>(M));
      jobs[j].keep = jobs[j].keep.to(torch::kBool);
    }
    if (head.at("labels").at(j).get<bool>()) {
      const size_t bytes = static_cast<size_t>(M) * sizeof(int64_t);
      jobs[j].labels = torch::empty({M}, torch::kLong);
      std::memcpy(jobs[j].labels.data_ptr(), take(bytes), bytes);
    }
  }
  return jobs;
}

/// This rank's share of the jobs, retrained: float64 [share, n, K].
torch::Tensor retrain_share(const Communicator& comm, const Retrainer& retrainer, const std::vector<RetrainJob>& jobs,
                            const torch::Tensor& x, RetrainOptions o) {
  const Share share = share_of(comm, std::vector<double>(jobs.size(), 1.0));
  if (share.size() == 0) return torch::zeros({0, x.size(0), retrainer.num_classes()}, torch::kFloat64);
  if (!o.work_file.empty()) {
    o.work_file += ".rank-" + std::to_string(comm.rank()) + "-of-" + std::to_string(comm.size());
  }
  o.progress = o.progress && comm.root();
  const std::vector<RetrainJob> mine(jobs.begin() + share.begin, jobs.begin() + share.end);
  return retrainer.outputs(mine, x, o);
}

}  // namespace

torch::Tensor retrain_outputs_across(const Communicator& comm, const Retrainer& retrainer,
                                     const std::vector<RetrainJob>& jobs, const torch::Tensor& x,
                                     const RetrainOptions& options, std::vector<int64_t>* rank_jobs) {
  if (rank_jobs) {
    rank_jobs->resize(static_cast<size_t>(comm.size()), 0);
    const std::vector<int64_t> bounds = split_by_cost(std::vector<double>(jobs.size(), 1.0), comm.size());
    for (size_t r = 0; r < rank_jobs->size(); ++r) (*rank_jobs)[r] += bounds[r + 1] - bounds[r];
  }
  if (comm.size() == 1) return retrainer.outputs(jobs, x, options);
  PK_CHECK(comm.root(), "retrain_outputs_across is called by the root (rank " << comm.rank() << ")");
  comm.broadcast(retrain_message(jobs, retrainer.num_train(), options));
  return comm.gather_rows(retrain_share(comm, retrainer, jobs, x, options));
}

void serve_retrainings(const Communicator& comm, const Retrainer& retrainer, const torch::Tensor& x) {
  PK_CHECK(!comm.root(), "serve_retrainings is called by the ranks other than the root");
  for (;;) {
    const std::string message = comm.broadcast("");
    if (message.empty()) return;
    RetrainOptions o;
    o.progress = false;
    const std::vector<RetrainJob> jobs = read_retrain_message(message, o);
    comm.gather_rows(retrain_share(comm, retrainer, jobs, x, o));
  }
}

void end_retrainings(const Communicator& comm) {
  if (comm.size() > 1 && comm.root()) comm.broadcast("");
}

GramFile gram_across(const Communicator& comm, PathReader& reader, const std::string& row_set,
                     const torch::Tensor& row_indices, const std::string& col_set, const torch::Tensor& col_indices,
                     const GramOptions& options) {
  if (comm.size() == 1) return gram_between(reader, row_set, row_indices, col_set, col_indices, options);
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t tests = reader.test_count(), trains = reader.train_count();
  comm.agree([&] {
    check_indices(row_set, row_indices, row_set == "test" ? tests : trains, "rows");
    check_indices(col_set, col_indices, col_set == "test" ? tests : trains, "columns");
  });
  // Split the test side (its points cost the quadrature); else the rows. In
  // whole blocks of gram()'s (test x test epk: 32 rows, whose pieces are
  // shared); the infinite-width kernel, a closed form, on the root alone.
  const bool split_cols = row_set != "test" && col_set == "test";
  const torch::Tensor& split = split_cols ? col_indices : row_indices;
  const std::unique_ptr<Kernel> kernel = make_kernel(options.kernel);
  const bool product = kernel->integrates_test_side() && row_set == "test" && col_set == "test";
  const int64_t block = kernel->closed_form() ? split.size(0)
                        : product             ? std::min<int64_t>(options.block, 32)
                                              : options.block;
  const Share share = share_of(comm, std::vector<double>(static_cast<size_t>(split.size(0)), 1.0), block);
  GramOptions local_options = options;
  local_options.progress = options.progress && comm.root();
  const int64_t K = reader.manifest().num_classes;
  const int64_t other = split_cols ? row_indices.size(0) : col_indices.size(0);
  torch::Tensor local;  // split side first: [share, other, K, K] or [share, other]
  if (share.size() > 0) {
    const torch::Tensor part = split.narrow(0, share.begin, share.size());
    const GramFile g = split_cols ? gram_between(reader, row_set, row_indices, col_set, part, local_options)
                                  : gram_between(reader, row_set, part, col_set, col_indices, local_options);
    local = split_cols ? g.matrix.transpose(0, 1).contiguous() : g.matrix;
  } else {
    local = options.trace ? torch::zeros({0, other}, torch::kFloat64) : torch::zeros({0, other, K, K}, torch::kFloat64);
  }
  torch::Tensor whole = comm.gather_rows(local);
  const double seconds = comm.max(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  GramFile g;
  if (!comm.root()) return g;
  g.matrix = split_cols ? whole.transpose(0, 1).contiguous() : whole;
  GramRecord& r = g.record;
  r.run = reader.dir();
  r.kernel = options.kernel;
  r.row_set = row_set;
  r.col_set = col_set;
  r.row_indices = to_vector(row_indices);
  r.col_indices = to_vector(col_indices);
  r.trace = options.trace;
  r.shape = g.matrix.sizes().vec();
  r.steps = reader.manifest().steps;
  r.quadrature = kernel->integrates_test_side() ? options.quadrature.spec.str() : "none";
  r.seconds = seconds;
  return g;
}

}  // namespace pathkernel
