// Training a model and recording its path in a run directory.
#include "pathkernel/run.h"

#include "pathkernel/context.h"
#include "pathkernel/error.h"
#include "pathkernel/run_writer.h"
#include "pathkernel/version.h"

namespace pathkernel {

RunResult train_run(const RunOptions& options) {
  PK_CHECK(!options.out.empty(), "no run directory given (--out)");
  PK_CHECK(options.checkpoint_every >= 0,
           "--checkpoint-every must be >= 1 (got " << options.checkpoint_every << ")");
  Dataset data = load_dataset(options.data);
  const int64_t m = data.x_train.size(0);
  options.train.validate(m);

  NetworkOptions net_options;
  net_options.spec = ModelSpec::parse(options.model);
  net_options.input_shape = data.input_shape;
  net_options.num_classes = data.num_classes;
  net_options.output = options.output;
  net_options.zero_last_layer = options.zero_last_layer;
  net_options.dtype = options.data.dtype;
  net_options.seed = options.seed;
  Network net = build_network(net_options);

  Manifest base;
  base.pathkernel_version = pathkernel_version();
  base.libtorch_version = libtorch_version();
  base.data = options.data;
  base.num_train = m;
  base.num_test = data.x_test.size(0);
  base.input_shape = data.input_shape;
  base.num_classes = data.num_classes;
  base.normalization = data.normalization;
  base.source = data.source;
  base.train_crc32 = training_data_crc32(data.x_train, data.y_train);
  base.model_spec = net_options.spec.str();
  base.output = output_map_name(options.output);
  base.zero_last_layer = options.zero_last_layer;
  base.init_seed = options.seed;
  base.dtype = dtype_name(options.data.dtype);
  base.parameters = parameter_layout(net);
  base.parameter_count = parameter_count(net);
  base.optimizer = options.train.optimizer;
  base.batch_size = (options.train.batch == 0 || options.train.batch >= m) ? 0 : options.train.batch;
  base.batch_seed = options.train.seed;
  base.schedule = options.train.schedule;
  base.threads = current_threads();
  const int64_t steps = options.train.total_steps(m);
  base.checkpoint_every =
      options.checkpoint_every == 0 ? default_checkpoint_every(steps) : options.checkpoint_every;

  RunWriter writer(options.out, base, options.force);
  RunResult result;
  result.summary = train(net, data.x_train, data.y_train, data.x_test, data.y_test, options.train, writer);
  writer.set_summary(nlohmann::ordered_json{{"final_batch_loss", result.summary.final_loss},
                                            {"train_accuracy", result.summary.train_accuracy},
                                            {"test_accuracy", result.summary.test_accuracy},
                                            {"seconds", result.summary.seconds}});
  result.manifest = writer.manifest();
  return result;
}

}  // namespace pathkernel
