// OpenBLAS's table of kernels, read by the names of the routines its
// entries point to: internal to the core (blas_switch.cpp mixes tables,
// threaded_products.cpp reads the products' block sizes and routines).
#pragma once

#include <cstddef>
#include <string>

namespace pathkernel {

/// The exported routine `p` points to, suffix and all ("samax_k_HASWELL"),
/// or "" where it points to none (null, or inside a routine).
std::string exported_routine(const void* p);

/// The byte offset in OpenBLAS's table of kernels of the entry for
/// `routine`, named without its kernels' suffix ("damax_k"), as the table
/// of the active kernels lays it out; 0 where it has none.
size_t kernel_table_offset(const std::string& routine);

/// The file of the BLAS whose dgemm_ LibTorch's products reach through
/// pathkernel's (threaded_products.h): the one after it, else the first;
/// "" where no dgemm_ is loaded.
std::string blas_library_file();

/// The table of kernels OpenBLAS calls through now (its `gotoblas`: one it
/// exports, or pathkernel's mix), or null without a DYNAMIC_ARCH OpenBLAS.
const unsigned char* active_kernel_table();

}  // namespace pathkernel
