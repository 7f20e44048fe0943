// OpenBLAS's table of kernels, read by the names of the routines its
// entries point to: internal to the core (blas_switch.cpp mixes tables,
// threaded_products.cpp reads the float32 products' block sizes).
#pragma once

#include <string>

namespace pathkernel {

/// The exported routine `p` points to, suffix and all ("samax_k_HASWELL"),
/// or "" where it points to none (null, or inside a routine).
std::string exported_routine(const void* p);

/// The table of kernels OpenBLAS calls through now (its `gotoblas`: one it
/// exports, or pathkernel's mix), or null without a DYNAMIC_ARCH OpenBLAS.
const unsigned char* active_kernel_table();

}  // namespace pathkernel
