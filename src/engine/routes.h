// The three routes' constructors, for make_route() (route.cpp). Internal to
// the engine.
#pragma once

#include <memory>
#include <string>

#include "pathkernel/route.h"

namespace pathkernel {

/// pathkernel's own networks (own_route.cpp).
std::unique_ptr<Route> make_own_route(Network& net);

/// The structured route for a TorchScript module whose graph is a plain
/// chain of pathkernel's own layers (ScriptGraph::chain()), walked as own
/// networks are (own_route.cpp); null for any other module, or when the
/// walk does not reproduce the module's outputs, with `why_not` saying why.
std::unique_ptr<Route> make_chain_route(Network& net, std::string& why_not);

/// Whether `route` evaluates the module's own outputs: two rows at t = 0.3
/// and 0.8 of a segment that moves every parameter, against the module at
/// the formed weights (left at the segment's start). Sets the route's segment.
bool rows_agree_with_module(Route& route, Network& net);

/// The structured route for a TorchScript module whose graph reads as rules
/// (script_route.cpp), or null when its rewritten graph does not reproduce
/// the module's outputs.
std::unique_ptr<Route> make_script_route(Network& net);

/// The generic route for a TorchScript module, with why it was taken
/// (autograd_route.cpp).
std::unique_ptr<Route> make_autograd_route(Network& net, const std::string& reason);

}  // namespace pathkernel
