// The program's frames that called an operation (src/cli/op_callers.cpp):
// found past the library's frames, named by addr2line, and the first of
// them that is the program's own code rather than a library's inline code.
#include <gtest/gtest.h>

#include "../../src/cli/op_callers.h"

namespace pathkernel::cli {
namespace {

/// A function of the program, not inlined, for addr2line to name.
[[gnu::noinline]] int a_named_function(int x) {
  asm volatile("" ::: "memory");
  return 3 * x + 1;
}

TEST(OpCallers, TheFirstNonLibraryFrameNamesTheCaller) {
  EXPECT_EQ(calling_function({"at::Tensor::to", "torch::zeros", "pathkernel::contract", "pathkernel::main"}),
            "pathkernel::contract");
  EXPECT_EQ(calling_function({"", "std::function<void ()>::operator()", ""}), "std::function<void ()>::operator()");
  EXPECT_EQ(calling_function({"", "", ""}), "");
}

TEST(OpCallers, OffsetsAreNamedByTheirFunctions) {
  const uintptr_t at = program_offset(reinterpret_cast<const void*>(&a_named_function));
  const std::vector<std::string> names = program_functions({at, at + 1});
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0], "pathkernel::cli::a_named_function");  // its parameters and namespace (anonymous) left out
  EXPECT_EQ(names[1], "pathkernel::cli::a_named_function");
  // An offset outside every function is given in hex.
  EXPECT_EQ(program_functions({0x1}), std::vector<std::string>{"0x1"});
  // A lambda inside a function (as a function pointer: its static invoker,
  // _FUN): every parameter list left out.
  auto lambda = [](int x) { return a_named_function(x) + 1; };
  int (*as_function)(int) = lambda;
  const std::string name = program_functions({program_offset(reinterpret_cast<const void*>(as_function))})[0];
  EXPECT_EQ(name, "pathkernel::cli::OpCallers_OffsetsAreNamedByTheirFunctions_Test::TestBody::{lambda#1}::_FUN");
}

}  // namespace
}  // namespace pathkernel::cli
