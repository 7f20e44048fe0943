// A segment and the route that evaluates the network on it.
#include "pathkernel/segment.h"

namespace pathkernel {

Network engine_network(NetworkOptions options) {
  options.dtype = torch::kFloat64;
  return build_network(options);
}

SegmentEvaluator::SegmentEvaluator(Network& net, ModuleRoute route) : route_(make_route(net, route)) {}

}  // namespace pathkernel
