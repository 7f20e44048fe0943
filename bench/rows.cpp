// The benchmark rows: each trains the runs it needs and measures one thing
// side by side, returning its numbers as JSON.
#include <sys/resource.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "algorithm1.h"
#include "bench.h"
#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/files.h"
#include "pathkernel/gram.h"
#include "pathkernel/npy.h"
#include "pathkernel/segment.h"

namespace pathkernel::bench {

using json = nlohmann::ordered_json;

double seconds_of(const std::function<void()>& fn) {
  auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median_of(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double median_seconds(int repeats, const std::function<void()>& fn) {
  std::vector<double> t;
  for (int i = 0; i < std::max(1, repeats); ++i) t.push_back(seconds_of(fn));
  return median_of(t);
}

RunOptions run_options(const std::string& data, int64_t train_size, const std::string& model,
                       const std::string& optimizer, int64_t steps, int64_t batch, double lr,
                       const std::string& out) {
  RunOptions r;
  r.data.spec = data;
  r.data.train_size = train_size;
  r.data.test_size = -1;
  r.model = model;
  r.train.optimizer.name = optimizer;
  r.train.optimizer.lr = lr;
  r.train.steps = steps;
  r.train.batch = batch;
  r.train.progress = false;
  r.out = out;
  r.force = true;
  return r;
}

double train_seconds(const RunOptions& options) {
  std::filesystem::create_directories(std::filesystem::path(options.out).parent_path());
  return train_run(options).summary.seconds;
}

DecompositionOptions quiet_decomposition(const std::string& quadrature) {
  DecompositionOptions o;
  o.quadrature.spec = QuadratureSpec::parse(quadrature);
  o.progress = false;
  return o;
}

double max_rel_error(const torch::Tensor& pred, const torch::Tensor& f) {
  return relative_error(pred, f).max().item<double>();
}

namespace {

std::string run_dir(const BenchConfig& c, const std::string& name) { return c.work + "/runs/" + name; }

/// The first n test inputs of the run.
torch::Tensor test_points(PathReader& reader, int64_t n) {
  return reader.test_inputs(torch::arange(std::min<int64_t>(n, reader.test_count()), torch::kLong));
}

/// pathkernel's attribution of x: the median time of `repeats` decompositions
/// (the last one is returned in d).
double time_decompose(PathReader& reader, const torch::Tensor& x, const DecompositionOptions& o, int repeats,
                      Decomposition& d) {
  return median_seconds(repeats, [&] { d = decompose(reader, x, o); });
}

// --- 1 and 2: Algorithm 1 and its PyTorch peer ------------------------------

/// Sized so that the peers take about a minute or more: on small settings
/// process start-up and loading decide the ratio.
struct Algorithm1Setup {
  int64_t train = 600, steps = 300, test = 10;
  int T = 100;
};

Algorithm1Setup algorithm1_setup(const BenchConfig& c) {
  Algorithm1Setup s;
  if (c.quick) s = {60, 5, 2, 10};
  return s;
}

/// Peak resident memory of this process so far, in MB (ru_maxrss is in KiB).
double peak_rss_mb() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

/// The model of the peer rows; the generic row exports the same network from PyTorch.
const int kAlgorithm1Hidden = 32;
const std::string kAlgorithm1Model = "mlp:" + std::to_string(kAlgorithm1Hidden);

RunOptions algorithm1_run(const BenchConfig& c) {
  Algorithm1Setup s = algorithm1_setup(c);
  return run_options("gaussians3", s.train, kAlgorithm1Model, "gd", s.steps, 0, 0.1, run_dir(c, "algorithm1"));
}

/// Writes what the Python peer needs into `dir`: every step's weights, the
/// data, the network's outputs, and pathkernel's contributions; `model` is the
/// mlp spec the peer builds (its flat parameter order is pathkernel's).
void export_peer_input(PathReader& reader, const torch::Tensor& x, const Decomposition& d, const std::string& model,
                       int T, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::vector<torch::Tensor> ws;
  reader.forward([&](const PathStep& st) { ws.push_back(st.w.clone()); });
  ws.push_back(reader.weights(reader.steps()));
  write_npy(dir + "/weights.npy", torch::stack(ws));
  write_npy(dir + "/x_train.npy", reader.decoded_dataset().x_train.to(torch::kFloat64).contiguous());
  write_npy(dir + "/y_train.npy", reader.decoded_dataset().y_train.contiguous());
  write_npy(dir + "/x_test.npy", x.to(torch::kFloat64).contiguous());
  write_npy(dir + "/f_final.npy", d.fN.contiguous());
  write_npy(dir + "/learning_rates.npy", torch::tensor(reader.manifest().learning_rates, torch::kFloat64));
  write_npy(dir + "/contributions_pathkernel.npy", d.contributions.contiguous());
  json spec{{"model", model}, {"output", "logsoftmax"}, {"T", T}};
  write_file_atomic(dir + "/spec.json", spec.dump(2));
}

/// Timings of pathkernel's side of the peer ratios: under a second each,
/// against a peer's minute, so the median of three times --repeats, which the
/// load of other processes moves less than a median of three.
int peer_repeats(const BenchConfig& c) { return 3 * c.repeats; }

/// The algorithm1 row's part 0: Algorithm 1 on the row's run and test
/// points, in a process of its own, its contributions and prediction
/// written to WORK/algorithm1/.
json algorithm1_part(const BenchConfig& c) {
  Algorithm1Setup s = algorithm1_setup(c);
  PathReader reader(algorithm1_run(c).out);
  Algorithm1Result a = algorithm1(reader, test_points(reader, s.test), s.T);
  const std::string dir = c.work + "/algorithm1";
  std::filesystem::create_directories(dir);
  write_npy(dir + "/contributions.npy", a.contributions.contiguous());
  write_npy(dir + "/prediction.npy", a.prediction().contiguous());
  return json{{"algorithm1_seconds", a.seconds}};  // its peak memory is the process's (run_parts)
}

json row_algorithm1(const BenchConfig& c) {
  if (c.part >= 0) return algorithm1_part(c);
  Algorithm1Setup s = algorithm1_setup(c);
  RunOptions r = algorithm1_run(c);
  double train = train_seconds(r);
  PathReader reader(r.out);
  torch::Tensor x = test_points(reader, s.test);
  Decomposition d;
  double pk = time_decompose(reader, x, quiet_decomposition(), peer_repeats(c), d);
  const double pathkernel_peak = peak_rss_mb();  // training and attribution, before the peers' files
  export_peer_input(reader, x, d, kAlgorithm1Model, s.T, c.work + "/peer_input");
  // The baseline in a process of its own, as the peers run: the row's
  // peak memory is then the larger of pathkernel's and the baseline's, not
  // their sum in one heap.
  const json a = run_parts(c, "algorithm1", 1).front();
  const torch::Tensor contributions = read_npy(c.work + "/algorithm1/contributions.npy"),
                      prediction = read_npy(c.work + "/algorithm1/prediction.npy");
  return json{{"setting", "gaussians3, " + std::to_string(s.train) + " training points, mlp:32, GD, " +
                              std::to_string(s.steps) + " steps, " + std::to_string(s.test) +
                              " test points; Algorithm 1 in a process of its own"},
              {"training_seconds", train},
              {"pathkernel_seconds", pk},
              {"algorithm1_seconds", a["algorithm1_seconds"]},
              {"algorithm1_T", s.T},
              {"pathkernel_max_rel_error", max_rel_error(d.prediction(), d.fN)},
              {"algorithm1_max_rel_error", max_rel_error(prediction, d.fN)},
              {"contributions_max_abs_difference", (contributions - d.contributions).abs().max().item<double>()},
              {"pathkernel_peak_rss_mb", pathkernel_peak},
              {"algorithm1_peak_rss_mb", a["peak_rss_mb"]}};
}

/// Runs a command, returning its standard output; throws Error on failure.
std::string run_command(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  PK_CHECK(p != nullptr, "cannot run '" << cmd << "'");
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, got);
  int status = pclose(p);
  PK_CHECK(status == 0, "'" << cmd << "' failed (exit status " << WEXITSTATUS(status) << ")");
  return out;
}

/// Runs a script of the repository (path and arguments) with Debian's Python.
std::string run_python(const BenchConfig& c, const std::string& script_and_args) {
  return run_command("/usr/bin/python3 " + c.source_dir + "/" + script_and_args);
}

/// What the Python peer printed (seconds, versions) and the contributions it wrote.
struct PeerResult {
  json info;
  torch::Tensor contributions;  ///< [n, M, K]
};

/// Runs the Python peer on the export in `dir`.
PeerResult run_peer(const BenchConfig& c, const std::string& dir) {
  PK_CHECK(std::filesystem::exists(dir + "/spec.json"), "no export for the peer in '" << dir << "'");
  std::string out =
      run_python(c, "bench/peers/algorithm1_vmap.py " + dir + " --threads " + std::to_string(current_threads()));
  return {json::parse(out.substr(out.rfind('{'))), read_npy(dir + "/contributions_peer.npy")};
}

std::string peer_versions(const json& peer) {
  return "Python " + peer["python"].get<std::string>() + ", PyTorch " + peer["torch"].get<std::string>() + ", " +
         peer["dtype"].get<std::string>();
}

json row_pytorch_peer(const BenchConfig& c) {
  Algorithm1Setup s = algorithm1_setup(c);
  RunOptions r = algorithm1_run(c);
  PathReader reader(r.out);  // trained by the algorithm1 row
  torch::Tensor x = test_points(reader, s.test);
  const std::string ex = c.work + "/peer_input";
  PK_CHECK(std::filesystem::exists(ex + "/spec.json"),
           "the pytorch_peer row needs the algorithm1 row's export in '" << ex << "': run the algorithm1 row first");
  Decomposition d;
  double pk = time_decompose(reader, x, quiet_decomposition(), peer_repeats(c), d);
  PeerResult peer = run_peer(c, ex);
  json j{{"setting", "the algorithm1 row's run and test points; " + peer_versions(peer.info)},
         {"pathkernel_seconds", pk},
         {"peer_seconds", peer.info["seconds"]},
         {"peer", peer.info},
         {"pathkernel_max_rel_error", max_rel_error(d.prediction(), d.fN)},
         {"peer_max_rel_error", max_rel_error(d.f0 + peer.contributions.sum(1), d.fN)}};
  return j;
}

/// The generic route (autograd alone, as for any TorchScript module) against
/// the same peer, on the same network exported from PyTorch
/// (examples/export_model.py mlp) and trained like the algorithm1 row's run.
json row_pytorch_peer_generic(const BenchConfig& c) {
  Algorithm1Setup s = algorithm1_setup(c);
  const std::string module = c.work + "/generic_mlp.pt";
  std::filesystem::create_directories(c.work);
  const int64_t inputs = load_dataset(algorithm1_run(c).data).x_train.size(1);  // the row runs alone too
  run_python(c, "examples/export_model.py mlp " + module + " --inputs " + std::to_string(inputs) + " --hidden " +
                    std::to_string(kAlgorithm1Hidden) + " --classes 3");
  RunOptions r = run_options("gaussians3", s.train, "torchscript:" + module, "gd", s.steps, 0, 0.1,
                             run_dir(c, "generic"));
  train_seconds(r);
  PathReader reader(r.out);
  torch::Tensor x = test_points(reader, s.test);
  DecompositionOptions o = quiet_decomposition();
  o.quadrature.route = ModuleRoute::Generic;
  Decomposition d;
  // Once: about 50 s, not a short measurement (--repeats); three took 212 s of the suite.
  double pk = time_decompose(reader, x, o, 1, d);
  const std::string ex = c.work + "/peer_input_generic";
  export_peer_input(reader, x, d, kAlgorithm1Model, s.T, ex);
  PeerResult peer = run_peer(c, ex);
  return json{{"setting", "the algorithm1 row's setting on " + kAlgorithm1Model +
                              " exported from PyTorch (TorchScript), pathkernel on the generic route; " +
                              peer_versions(peer.info)},
              {"pathkernel_seconds", pk},
              {"route", engine_route(reader, o).route},
              {"peer_seconds", peer.info["seconds"]},
              {"pathkernel_max_rel_error", max_rel_error(d.prediction(), d.fN)},
              {"peer_max_rel_error", max_rel_error(d.f0 + peer.contributions.sum(1), d.fN)},
              {"contributions_max_abs_difference",
               (peer.contributions - d.contributions).abs().max().item<double>()}};
}

// --- 3 and 5: full-batch attribution against training; the stored path ------

json row_full_batch(const BenchConfig& c) {
  const int64_t steps = c.quick ? 5 : 300, n_small = c.quick ? 2 : 10, n_large = c.quick ? 4 : 100;
  RunOptions r = run_options("gaussians3", c.quick ? 300 : -1, c.quick ? "mlp:16" : "mlp:256", "gd", steps, 0, 0.1,
                             run_dir(c, "full_batch"));
  // Training, the two attributions and the replay in turn, --repeats
  // rounds, and the median of each: timed once each, the ratios followed
  // the machine's drift (the replay alone took 2.0 s in one run, 3.0 s in
  // the next). Training is deterministic: every round trains the same run.
  std::vector<double> trains, t10s, t100s, replays;
  Decomposition d10, d100;
  ReplayReport rep;
  for (int round = 0; round < (c.quick ? 1 : c.repeats); ++round) {
    trains.push_back(train_seconds(r));
    PathReader reader(r.out);
    t10s.push_back(time_decompose(reader, test_points(reader, n_small), quiet_decomposition(), 1, d10));
    t100s.push_back(time_decompose(reader, test_points(reader, n_large), quiet_decomposition(), 1, d100));
    replays.push_back(seconds_of([&] { rep = reader.check(false); }));
  }
  const double train = median_of(trains), t10 = median_of(t10s), t100 = median_of(t100s),
               replay = median_of(replays);
  PathReader reader(r.out);
  const Manifest& m = reader.manifest();
  const double every_step = static_cast<double>(m.steps + 1) * static_cast<double>(m.parameter_count) * 8.0;
  return json{{"setting", "gaussians3, " + std::to_string(m.num_train) + " training points, " + m.model_spec +
                              ", full-batch GD, " + std::to_string(steps) + " steps; training, attributions and replay "
                              "in turn, the median of " + std::to_string(trains.size()) + " rounds"},
              {"training_seconds", train},
              {"attribution_seconds_10", t10},
              {"attribution_seconds_100", t100},
              {"test_points_small", n_small},
              {"test_points_large", n_large},
              {"max_rel_error_10", max_rel_error(d10.prediction(), d10.fN)},
              {"max_rel_error_100", max_rel_error(d100.prediction(), d100.fN)},
              {"evaluations_per_step_100", static_cast<double>(d100.evaluations) / (n_large * steps)},
              {"replay_seconds", replay},
              {"replay_bitwise_equal", rep.bitwise_equal},
              {"every_step_bytes", every_step},
              {"stored_bytes", m.path_bytes()},
              {"checkpoints", m.checkpoints.size()},
              {"rounds", {{"training_seconds", trains},
                          {"attribution_seconds_10", t10s},
                          {"attribution_seconds_100", t100s},
                          {"replay_seconds", replays}}}};
}

// --- 3b: a real-size run: full Fashion-MNIST, one epoch ----------------------

/// One round of the real-size row (its part c.part): training, then the
/// attribution of the test points, in this process; its peaks after each.
json real_size_round(const BenchConfig& c) {
  const int64_t n = c.quick ? 4 : 100;
  RunOptions r = run_options("fashion-mnist", c.quick ? 500 : -1, "mlp:128", "sgd", -1, 128, 0.1,
                             run_dir(c, "real_size"));
  r.train.epochs = 1;
  const double training = train_seconds(r);
  const double training_peak = peak_rss_mb();
  PathReader reader(r.out);
  Decomposition d;
  const double attribution = time_decompose(reader, test_points(reader, n), quiet_decomposition(), 1, d);
  const Manifest& m = reader.manifest();
  return json{{"setting", "fashion-mnist, " + std::to_string(m.num_train) + " training points, " + m.model_spec +
                              ", SGD batch 128, lr 0.1, one epoch (" + std::to_string(m.steps) + " steps), " +
                              std::to_string(n) + " test points"},
              {"training_seconds", training},
              {"attribution_seconds", attribution},
              {"test_points", n},
              {"max_rel_error", max_rel_error(d.prediction(), d.fN)},
              {"evaluations_per_step", static_cast<double>(d.evaluations) / static_cast<double>(n * m.steps)},
              {"peak_rss_mb_after_training", training_peak},
              {"peak_rss_mb_after_attribution", peak_rss_mb()}};
}

json row_real_size(const BenchConfig& c) {
  if (c.part >= 0) return real_size_round(c);
  // Training and attribution in turn, --repeats rounds, as the full-batch
  // row: the training, under a second, timed once moved the ratio by a
  // tenth from run to run. Training is deterministic: every round trains
  // the same run. Each round is a process of its own, as users run
  // `pathkernel train` and then an attribution: in one process the
  // allocator's heap grew from round to round (570, 1,027 and 1,485 MB at
  // the rounds' starts, 42 MB of it in use).
  const std::vector<json> rounds = run_parts(c, "real_size", c.quick ? 1 : c.repeats);
  std::vector<double> trains, attributions, ratios, errors, peaks_training, peaks_attribution, peaks_process;
  for (const json& r : rounds) {
    trains.push_back(r["training_seconds"].get<double>());
    attributions.push_back(r["attribution_seconds"].get<double>());
    ratios.push_back(attributions.back() / trains.back());
    errors.push_back(r["max_rel_error"].get<double>());
    peaks_training.push_back(r["peak_rss_mb_after_training"].get<double>());
    peaks_attribution.push_back(r["peak_rss_mb_after_attribution"].get<double>());
    peaks_process.push_back(r["peak_rss_mb"].get<double>());
  }
  auto most = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
  const json& first = rounds.front();
  return json{{"setting", first["setting"].get<std::string>() + "; training and attribution in turn, the median of " +
                              std::to_string(rounds.size()) + " rounds, each a process of its own"},
              {"training_seconds", median_of(trains)},
              {"attribution_seconds", median_of(attributions)},
              {"attribution_over_training", median_of(ratios)},
              {"rounds", {{"training_seconds", trains},
                          {"attribution_seconds", attributions},
                          {"peak_rss_mb", peaks_process}}},
              {"test_points", first["test_points"]},
              {"max_rel_error", most(errors)},
              {"evaluations_per_step", first["evaluations_per_step"]},
              {"peak_rss_mb_after_training", most(peaks_training)},
              {"peak_rss_mb_after_attribution", most(peaks_attribution)}};
}

// --- 4: quadrature on the MNIST CNN ----------------------------------------

json row_quadrature(const BenchConfig& c) {
  const int64_t steps = c.quick ? 2 : 20, n = c.quick ? 1 : 3;
  RunOptions r = run_options("mnist", c.quick ? 100 : 500, c.quick ? "cnn:2,4" : "cnn:8,16", "sgd", steps, 100, 0.05,
                             run_dir(c, "quadrature"));
  double train = train_seconds(r);
  PathReader reader(r.out);
  torch::Tensor x = test_points(reader, n);
  json rules = json::array();
  double gauss_evals = 0, gauss_err = 0;
  std::vector<std::string> specs{"gauss", "dpk", "riemann:1", "riemann:10", "riemann:100", "riemann:200"};
  if (c.quick) specs = {"gauss", "dpk", "riemann:10"};
  for (const std::string& q : specs) {
    Decomposition d;
    double t = time_decompose(reader, x, quiet_decomposition(q), 1, d);
    const double evals = static_cast<double>(d.evaluations) / static_cast<double>(n * steps);
    const double err = max_rel_error(d.prediction(), d.fN);
    if (q == "gauss") gauss_evals = evals, gauss_err = err;
    rules.push_back(json{{"quadrature", q},
                         {"evaluations_per_step", evals},
                         {"forward_evaluations_per_step", static_cast<double>(d.forward_evaluations) / (n * steps)},
                         {"moment_evaluations_per_step", static_cast<double>(d.moment_evaluations) / (n * steps)},
                         {"kinks_per_step", static_cast<double>(d.kinks) / (n * steps)},
                         {"max_rel_error", err},
                         {"seconds", t}});
  }
  return json{{"setting", "mnist, " + std::to_string(reader.manifest().num_train) + " training points, " +
                              reader.manifest().model_spec + ", SGD batch 100, lr 0.05, " + std::to_string(steps) +
                              " steps, " + std::to_string(n) + " test points"},
              {"training_seconds", train},
              {"gauss_evaluations_per_step", gauss_evals},
              {"gauss_max_rel_error", gauss_err},
              {"rules", rules}};
}

// --- 6: structured against dense Gram ---------------------------------------

/// The trace NTK Gram Σ_k J_k(x_i)·J_k(x_j) at w from per-sample Jacobians
/// formed by autograd, one output at a time ([M, P] each), and dense GEMMs.
torch::Tensor dense_trace_gram(Network& net, const torch::Tensor& x) {
  std::vector<torch::Tensor> params = net->parameters();
  const int64_t M = x.size(0);
  torch::Tensor gram = torch::zeros({M, M}, torch::kFloat64);
  torch::Tensor out = net->forward(x.narrow(0, 0, 1));
  const int64_t K = out.size(1), P = parameter_count(net);
  torch::Tensor J = torch::empty({M, P}, torch::kFloat64);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t i = 0; i < M; ++i) {
      torch::Tensor f = net->forward(x.narrow(0, i, 1));
      auto grads = torch::autograd::grad({f[0][k]}, params);
      int64_t off = 0;
      for (auto& g : grads) {
        J[i].narrow(0, off, g.numel()).copy_(g.reshape({-1}));
        off += g.numel();
      }
    }
    gram.addmm_(J, J.t());
  }
  return gram;
}

json row_gram(const BenchConfig& c) {
  const int64_t M = c.quick ? 100 : 2000, steps = c.quick ? 2 : 10;
  RunOptions r = run_options("mnist", M, c.quick ? "mlp:16" : "mlp:128", "sgd", steps, 100, 0.1, run_dir(c, "gram"));
  train_seconds(r);
  PathReader reader(r.out);
  const torch::Tensor x = reader.decoded_dataset().x_train.to(torch::kFloat64);
  GramOptions o;
  o.kernel = GramSpec::parse("ntk:" + std::to_string(steps));
  o.trace = true;
  o.progress = false;
  torch::Tensor gs, gd;
  double structured = seconds_of([&] { gs = gram(reader, x, false, x, false, o); });
  Network net = engine_network(reader.manifest().network_options());
  set_flat_parameters(net, reader.weights(steps));
  double dense = seconds_of([&] { gd = dense_trace_gram(net, x); });
  return json{{"setting", "mnist, " + std::to_string(M) + " training points, " + reader.manifest().model_spec +
                              ", train x train NTK at step " + std::to_string(steps) + ", trace over outputs"},
              {"parameters", reader.manifest().parameter_count},
              {"structured_seconds", structured},
              {"dense_seconds", dense},
              {"max_abs_difference", (gs - gd).abs().max().item<double>()},
              {"max_rel_difference", ((gs - gd).abs().max() / gd.abs().max()).item<double>()}};
}

// --- 7: threads and scaling ------------------------------------------------

json row_threads(const BenchConfig& c) {
  const int64_t steps = c.quick ? 5 : 100, n = c.quick ? 2 : 10;
  json j;
  std::unique_ptr<PathReader> reader[3];
  for (int threads : {1, 2}) {
    ThreadScope scope(threads);
    RunOptions r = run_options("gaussians3", c.quick ? 300 : -1, c.quick ? "mlp:16" : "mlp:256", "gd", steps, 0, 0.1,
                               run_dir(c, "threads_" + std::to_string(threads)));
    j["training_seconds_" + std::to_string(threads)] = train_seconds(r);
    reader[threads] = std::make_unique<PathReader>(r.out);
  }
  // The two counts' timings alternate, 3 x --repeats of each, so that the
  // load of other processes falls on both alike: timed one count after the
  // other, the ratio moved from 1.25 to 1.53 between two runs of the suite
  // while the row alone gave 1.27 to 1.35.
  std::vector<double> t[3];
  for (int i = 0; i < 3 * c.repeats; ++i) {
    for (int threads : {1, 2}) {
      ThreadScope scope(threads);
      PathReader& rd = *reader[threads];
      const torch::Tensor x = test_points(rd, n);
      t[threads].push_back(seconds_of([&] { (void)decompose(rd, x, quiet_decomposition()); }));
    }
  }
  double median[3] = {0, 0, 0};
  for (int threads : {1, 2}) {
    median[threads] = median_of(t[threads]);
    j["attribution_seconds_" + std::to_string(threads)] = median[threads];
  }
  j["setting"] = "gaussians3, full training set, mlp:256, full-batch GD, " + std::to_string(steps) + " steps, " +
                 std::to_string(n) + " test points; each run trained and attributed with the same thread count, " +
                 "the two counts' attributions timed alternately";
  j["thread_speedup"] = median[1] / median[2];
  return j;
}

/// Attribution time at three sizes of one quantity; the growth exponent
/// log(t3/t1)/log(size3/size1) is 1 for linear growth.
json scaling(const BenchConfig& c, const std::string& what) {
  std::vector<int64_t> sizes = what == "training_points" ? std::vector<int64_t>{500, 1000, 2000}
                               : what == "test_points"   ? std::vector<int64_t>{10, 20, 40}
                                                         : std::vector<int64_t>{50, 100, 200};
  if (c.quick) for (auto& s : sizes) s = std::max<int64_t>(2, s / 10);
  json points = json::array();
  std::vector<double> times;
  for (int64_t size : sizes) {
    const int64_t M = what == "training_points" ? size : (c.quick ? 100 : 1000);
    const int64_t n = what == "test_points" ? size : (c.quick ? 2 : 10);
    const int64_t steps = what == "steps" ? size : (c.quick ? 10 : 100);
    RunOptions r = run_options("gaussians3", M, "mlp:64", "gd", steps, 0, 0.1, run_dir(c, "scaling"));
    train_seconds(r);
    PathReader reader(r.out);
    Decomposition d;
    double t = time_decompose(reader, test_points(reader, n), quiet_decomposition(), c.repeats, d);
    times.push_back(t);
    points.push_back(json{{"training_points", M}, {"test_points", n}, {"steps", steps}, {"seconds", t},
                          {"max_rel_error", max_rel_error(d.prediction(), d.fN)}});
  }
  const double exponent = std::log(times.back() / times.front()) /
                          std::log(static_cast<double>(sizes.back()) / static_cast<double>(sizes.front()));
  return json{{"setting", "gaussians3, mlp:64, full-batch GD, attribution time against " + what},
              {"points", points},
              {"growth_exponent", exponent}};
}

// --- 8: the two CNNs, through the pathkernel command ----------------

/// A pathkernel command's JSON, and its process's wall seconds and peak
/// resident memory (from wait4).
struct CommandRun {
  json out;
  double seconds = 0;
  double peak_rss_mb = 0;
};

/// Runs `pathkernel --quiet --json --threads T ARGS` as a process of its own;
/// its JSON is kept in the work directory as rows/LABEL.json.
CommandRun run_pathkernel(const BenchConfig& c, const std::string& label, const std::vector<std::string>& args,
                          int threads) {
  std::vector<std::string> argv{c.pathkernel, "--quiet", "--json", "--threads", std::to_string(threads)};
  argv.insert(argv.end(), args.begin(), args.end());
  std::filesystem::create_directories(c.work + "/rows");
  const std::string out = c.work + "/rows/" + label + ".json";
  const ProcessRun p = run_process(argv, "pathkernel " + args[0], out);
  PK_CHECK(p.ok, "pathkernel " << args[0] << " failed in a bench row");
  CommandRun r;
  r.seconds = p.seconds;
  r.peak_rss_mb = p.peak_rss_mb;
  const std::string text = read_file(out);
  r.out = json::parse(text.substr(text.find('{')));
  return r;
}

/// The test side's GFLOP that `verify --json` reports.
double test_side_gflop(const CommandRun& verify) {
  return verify.out["arithmetic"]["test_side_gflop"].get<double>();
}

/// The training side's GFLOP that `verify --json` reports (one walk of the path).
double training_side_gflop(const CommandRun& verify) {
  return verify.out["arithmetic"]["training_side_gflop"].get<double>();
}

/// A verify's floor: its test side's and training side's products at the
/// machine's dgemm GFLOP/s (the replay, training's own arithmetic in the
/// run's dtype, and the contraction are not counted).
double floor_seconds(const CommandRun& verify, double dgemm) {
  return (test_side_gflop(verify) + training_side_gflop(verify)) / dgemm;
}

/// The user CNN (scripts/measure_compact_recording.py: two 3x3
/// convolutions, 105,866 parameters, Adam, float32, Fashion-MNIST) trained
/// and recorded by its own Python loop for one epoch (468 steps, on one
/// thread, torch's and OpenBLAS's, as the loop was measured), then verified on 1 and on 8 test
/// points on two threads; the floor at two threads' dgemm speed.
json row_user_cnn(const BenchConfig& c) {
  const int64_t steps = c.quick ? 3 : 468, threads = 2;
  const std::string run = run_dir(c, "user_cnn"), loop_json = c.work + "/user_cnn_loop.json";
  const std::string eight = c.quick ? "1-2" : "1-8";
  std::filesystem::create_directories(c.work + "/runs");
  run_python(c, "scripts/measure_compact_recording.py --steps " + std::to_string(steps) + " --run " + run +
                    " --json " + loop_json + " --repeats " + std::to_string(c.repeats) + " --threads 1");
  const json loop = json::parse(read_file(loop_json));
  const CommandRun v1 = run_pathkernel(c, "user_cnn_verify_1", {"verify", run, "--test", "1"}, threads);
  const CommandRun v8 = run_pathkernel(c, "user_cnn_verify_8", {"verify", run, "--test-index", eight}, threads);
  const double training = loop["seconds_plain"].get<double>(), dgemm = machine_dgemm_gflops(c, threads);
  return json{{"setting", "the user's CNN (" + std::to_string(loop["parameters"].get<int64_t>()) +
                              " parameters), Adam lr 1e-3, batch 128, float32, Fashion-MNIST, its own Python loop "
                              "recorded for " + std::to_string(steps) + " steps; verify --test 1 and --test-index " +
                              eight + " on two threads"},
              {"steps", steps},
              {"seconds_training", training},
              {"seconds_recorded", loop["seconds_recorded"]},
              {"seconds_verify_1", v1.seconds},
              {"seconds_verify_8", v8.seconds},
              {"verify_1_over_training", v1.seconds / training},
              {"verify_8_over_verify_1", v8.seconds / v1.seconds},
              {"max_rel_error_1", v1.out["max_rel_error"]},
              {"max_rel_error_8", v8.out["max_rel_error"]},
              {"evaluations_per_step_1", v1.out["mean_evaluations_per_step"]},
              {"evaluations_per_step_8", v8.out["mean_evaluations_per_step"]},
              {"seconds_by_part_1", v1.out["seconds_by_part"]},
              {"test_side_gflop", test_side_gflop(v1)},
              {"test_side_gflop_8", test_side_gflop(v8)},
              {"training_side_gflop", training_side_gflop(v1)},
              {"dgemm_gflops_2_threads", dgemm},
              {"floor_seconds", floor_seconds(v1, dgemm)},
              {"verify_1_over_floor", v1.seconds / floor_seconds(v1, dgemm)},
              {"verify_8_over_floor", v8.seconds / floor_seconds(v8, dgemm)},
              {"peak_rss_mb_verify_1", v1.peak_rss_mb},
              {"peak_rss_mb_verify_8", v8.peak_rss_mb}};
}

/// The README's CNN as docs/measurements.md trains it (MNIST, cnn:8,16, SGD
/// lr 0.05, batch 100, 200 steps), then verify --test 10 (--repeats times,
/// the median); all on two threads.
json row_readme_cnn(const BenchConfig& c) {
  const int threads = 2;
  const std::string run = run_dir(c, "readme_cnn"), steps = c.quick ? "5" : "200", n = c.quick ? "2" : "10";
  std::vector<std::string> train{"train", "--data",  "mnist", "--model", "cnn:8,16", "--optimizer", "sgd", "--lr",
                                 "0.05",  "--batch", "100",   "--steps", steps,      "--out",       run,   "--force"};
  if (c.quick) train.insert(train.end(), {"--train-size", "500"});
  std::filesystem::create_directories(c.work + "/runs");
  const CommandRun t = run_pathkernel(c, "readme_cnn_train", train, threads);
  // The median of --repeats verifies: the first after training ran up to a
  // fifth slower than the ones after it (12.3 s in a run, 10.7 s alone).
  std::vector<CommandRun> runs;
  std::vector<double> seconds;
  for (int i = 0; i < (c.quick ? 1 : std::max(1, c.repeats)); ++i) {
    runs.push_back(run_pathkernel(c, "readme_cnn_verify_10_" + std::to_string(i), {"verify", run, "--test", n}, threads));
    seconds.push_back(runs.back().seconds);
  }
  const CommandRun& v = runs.front();  // its outputs; every run's are the same
  const double verify = median_of(seconds);
  double peak = 0;
  for (const CommandRun& r : runs) peak = std::max(peak, r.peak_rss_mb);
  const double training = t.out["seconds"].get<double>(), dgemm = machine_dgemm_gflops(c, threads);
  return json{{"setting", "mnist, cnn:8,16, SGD lr 0.05, batch 100, " + steps + " steps (pathkernel train); verify --test " +
                              n + "; two threads"},
              {"steps", std::stoll(steps)},
              {"seconds_training", training},
              {"seconds_train_command", t.seconds},
              {"seconds_verify_10", verify},
              {"seconds_verify_10_runs", seconds},
              {"verify_10_over_training", verify / training},
              {"max_rel_error", v.out["max_rel_error"]},
              {"evaluations_per_step", v.out["mean_evaluations_per_step"]},
              {"test_side_gflop", test_side_gflop(v)},
              {"training_side_gflop", training_side_gflop(v)},
              {"dgemm_gflops_2_threads", dgemm},
              {"floor_seconds", floor_seconds(v, dgemm)},
              {"verify_10_over_floor", verify / floor_seconds(v, dgemm)},
              {"peak_rss_mb_verify_10", peak}};
}

}  // namespace

const std::vector<Row>& rows() {
  static const std::vector<Row> all{
      {"machine", "the floor: float64 dgemm on 1 thread, 2 threads and 2 processes at once", row_machine},
      {"algorithm1", "pathkernel vs the paper's Algorithm 1 (per-sample Jacobians, Riemann T=100)", row_algorithm1},
      {"pytorch_peer", "pathkernel vs Algorithm 1 in PyTorch with functorch's vmap", row_pytorch_peer},
      {"pytorch_peer_generic", "the generic (TorchScript) route vs the same PyTorch peer on the same network",
       row_pytorch_peer_generic},
      {"full_batch", "attribution of 10 and 100 test points vs training; path storage and replay", row_full_batch},
      {"real_size", "attribution of 100 test points vs one epoch on full Fashion-MNIST, with peak memory",
       row_real_size},
      {"quadrature", "gauss evaluations per step vs riemann:T and dpk errors on the MNIST CNN", row_quadrature},
      {"gram", "train x train NTK Gram: structured vs dense Jacobian contraction", row_gram},
      {"threads", "attribution with 2 threads vs 1", row_threads},
      {"scaling_training_points", "attribution time vs training points",
       [](const BenchConfig& c) { return scaling(c, "training_points"); }},
      {"scaling_test_points", "attribution time vs test points",
       [](const BenchConfig& c) { return scaling(c, "test_points"); }},
      {"scaling_steps", "attribution time vs steps", [](const BenchConfig& c) { return scaling(c, "steps"); }},
      {"user_cnn", "verify of the user's CNN recorded from its own Python loop: 1 and 8 test points vs the loop",
       row_user_cnn},
      {"readme_cnn", "verify --test 10 of the README's CNN (cnn:8,16, 200 steps) on 2 threads", row_readme_cnn},
  };
  return all;
}

}  // namespace pathkernel::bench
