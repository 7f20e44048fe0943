// A segment and the route that evaluates the network on it.
#include "pathkernel/segment.h"

namespace pathkernel {

Network engine_network(NetworkOptions options) {
  options.dtype = torch::kFloat64;
  // A run's Linear pieces reproduce its training's bits, which the replay's
  // network does (PathReader); the engine's float64 network has none to
  // reproduce, and a product in one piece is the simpler graph to
  // differentiate twice.
  options.linear_pieces = 1;
  return build_network(options);
}

SegmentEvaluator::SegmentEvaluator(Network& net, ModuleRoute route) : route_(make_route(net, route)) {}

}  // namespace pathkernel
