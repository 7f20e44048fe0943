// A dataset's inputs as held: whole, or as codes decoded on selection
// (dataset.h). Apart from the registry, so that the readers alone (the fuzz
// harnesses') have them.
#include "pathkernel/dataset.h"

namespace pathkernel {

int64_t train_count(const Dataset& data) {
  return data.x_train_coded.defined() ? data.x_train_coded.size() : data.x_train.size(0);
}

torch::Tensor train_inputs(const Dataset& data, const torch::Tensor& index) {
  if (!data.x_train_coded.defined()) return index.defined() ? data.x_train.index_select(0, index) : data.x_train;
  return index.defined() ? data.x_train_coded.rows(index) : data.x_train_coded.all();
}

torch::Tensor train_input(const Dataset& data, int64_t i) {
  return train_inputs(data, torch::tensor({i}, torch::kLong))[0];
}

int64_t test_count(const Dataset& data) {
  return data.x_test_coded.defined() ? data.x_test_coded.size() : data.x_test.size(0);
}

torch::Dtype input_dtype(const Dataset& data) {
  const torch::Tensor& held = data.x_test_coded.defined() ? data.x_test_coded.values : data.x_test;
  return held.scalar_type();
}

torch::Tensor test_inputs(const Dataset& data, const torch::Tensor& index) {
  if (!data.x_test_coded.defined()) return index.defined() ? data.x_test.index_select(0, index) : data.x_test;
  return index.defined() ? data.x_test_coded.rows(index) : data.x_test_coded.all();
}

torch::Tensor test_input(const Dataset& data, int64_t i) {
  return test_inputs(data, torch::tensor({i}, torch::kLong))[0];
}

}  // namespace pathkernel
