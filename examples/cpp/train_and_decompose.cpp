// The C++ API in one program: train a small network on the paper's 3-class
// Gaussians with minibatch SGD, recording its path; replay the path; split one
// test prediction exactly into the contributions of the training points; and
// list the points that pushed the predicted class up and down.
//
//   usage: train_and_decompose [RUN_DIR]     (default: runs/api-example)
//
// Exits non-zero unless the kernel machine matches the network to 1e-12
// relative (`make test` builds and runs it).
#include <cstdio>
#include <exception>
#include <string>

#include <pathkernel/pathkernel.h>

int main(int argc, char** argv) {
  try {
    const std::string dir = argc > 1 ? argv[1] : "runs/api-example";

    // 1. Train and record: every option has a library default; these are the ones we change.
    pathkernel::RunOptions run;
    run.data.spec = "gaussians3";
    run.data.train_size = 300;
    run.data.test_size = 30;
    run.model = "mlp:16";
    run.train.optimizer.name = "sgd";
    run.train.optimizer.lr = 0.1;
    run.train.batch = 50;
    run.train.steps = 40;
    run.train.progress = false;
    run.out = dir;
    run.force = true;
    const pathkernel::RunResult trained = pathkernel::train_run(run);
    std::printf("trained %s: %lld steps, %lld parameters, test accuracy %.3f\n", trained.manifest.model_spec.c_str(),
                static_cast<long long>(trained.manifest.steps),
                static_cast<long long>(trained.manifest.parameter_count), trained.summary.test_accuracy);

    // 2. Replay the path and decompose test point 0.
    pathkernel::PathReader reader(dir);
    const torch::Tensor x = reader.test_inputs(pathkernel::TestPointSelection{}.resolve(reader.test_count(), 1));
    pathkernel::DecompositionOptions options;
    options.progress = false;
    const pathkernel::Decomposition d = pathkernel::decompose(reader, x, options);
    const pathkernel::DecompositionSummary s = pathkernel::summarize(d);

    // 3. f(w_N, x) = f(w_0, x) + sum_i C_i(x) + R(x) + E(x): the predicted class's share per training point.
    const int64_t k = d.fN[0].argmax().item<int64_t>();
    const torch::Tensor c = d.contributions[0].select(1, k);  // [M]
    std::printf("test point 0: predicted class %lld, f = %.6f = f(w_0) %.6f + contributions %.6f + R %.1e + E %.1e\n",
                static_cast<long long>(k), d.fN[0][k].item<double>(), d.f0[0][k].item<double>(),
                c.sum().item<double>(), d.regularization[0][k].item<double>(), d.rounding[0][k].item<double>());
    for (bool up : {true, false}) {
      auto [values, index] = c.topk(3, 0, up);
      std::printf("  %s:", up ? "proponents" : "opponents ");
      for (int64_t j = 0; j < 3; ++j) {
        const int64_t i = index[j].item<int64_t>();
        std::printf("  #%lld (class %lld) %+.4f", static_cast<long long>(i),
                    static_cast<long long>(reader.held_dataset().y_train[i].item<int64_t>()), values[j].item<double>());
      }
      std::printf("\n");
    }
    std::printf("kernel machine vs network: max relative error %.2e, certificate gap %.1e\n", s.max_rel_error,
                s.certificate_max_gap);
    return s.max_rel_error <= 1e-12 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_and_decompose: %s\n", e.what());
    return 1;
  }
}
