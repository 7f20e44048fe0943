// fig5: kernel values and the GP's standard deviation on a toy2d grid.
#include "common.h"
#include "pathkernel/error.h"

namespace pathkernel::experiments {

ExperimentResult fig5(const ExperimentOptions& /*options*/) {
  PK_THROW("experiment fig5 is not available yet: it needs the test-test EPK diagonal (gram_diagonal)");
}

}  // namespace pathkernel::experiments
