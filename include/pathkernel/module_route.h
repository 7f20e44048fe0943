// How a TorchScript module is decomposed: the user's choice of route
// (--route), which the engine's route factory honours (segment.h).
#pragma once

namespace pathkernel {

/// How a TorchScript module is decomposed (pathkernel's own models have one way).
enum class ModuleRoute {
  Auto,     ///< structured where every parameter has a rule, else generic
  Generic,  ///< autograd alone, whatever the module holds
};

}  // namespace pathkernel
