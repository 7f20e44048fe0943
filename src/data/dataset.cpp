// A dataset's inputs as held: whole, or as codes decoded on selection
// (dataset.h). Apart from the registry, so that the readers alone (the fuzz
// harnesses') have them.
#include "pathkernel/dataset.h"

namespace pathkernel {

int64_t HeldInputs::count() const { return held().size(0); }

torch::Tensor HeldInputs::rows(const torch::Tensor& index) const {
  if (!coded()) return index.defined() ? whole_.index_select(0, index) : whole_;
  return index.defined() ? coded_.rows(index) : coded_.all();
}

torch::Tensor HeldInputs::range(int64_t first, int64_t n) const {
  return coded() ? coded_.range(first, n) : whole_.narrow(0, first, n);
}

HeldInputs held_train_inputs(const Dataset& data) { return {data.x_train, data.x_train_coded}; }

HeldInputs held_test_inputs(const Dataset& data) { return {data.x_test, data.x_test_coded}; }

int64_t train_count(const Dataset& data) { return held_train_inputs(data).count(); }

torch::Tensor train_inputs(const Dataset& data, const torch::Tensor& index) {
  return held_train_inputs(data).rows(index);
}

torch::Tensor train_input(const Dataset& data, int64_t i) {
  return train_inputs(data, torch::tensor({i}, torch::kLong))[0];
}

int64_t test_count(const Dataset& data) { return held_test_inputs(data).count(); }

torch::Dtype input_dtype(const Dataset& data) { return held_test_inputs(data).values().scalar_type(); }

torch::Tensor test_inputs(const Dataset& data, const torch::Tensor& index) {
  return held_test_inputs(data).rows(index);
}

torch::Tensor test_input(const Dataset& data, int64_t i) {
  return test_inputs(data, torch::tensor({i}, torch::kLong))[0];
}

}  // namespace pathkernel
