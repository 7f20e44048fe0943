// The three routes' constructors, for make_route() (route.cpp). Internal to
// the engine.
#pragma once

#include <memory>
#include <string>

#include "pathkernel/route.h"

namespace pathkernel {

/// pathkernel's own networks (own_route.cpp).
std::unique_ptr<Route> make_own_route(Network& net);

/// The structured route for a TorchScript module whose graph reads as rules
/// (script_route.cpp), or null when its rewritten graph does not reproduce
/// the module's outputs.
std::unique_ptr<Route> make_script_route(Network& net);

/// The generic route for a TorchScript module, with why it was taken
/// (autograd_route.cpp).
std::unique_ptr<Route> make_autograd_route(Network& net, const std::string& reason);

}  // namespace pathkernel
