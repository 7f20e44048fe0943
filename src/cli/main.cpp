// pathkernel's entry point: run the application, report user errors.
#include <cstdio>
#include <exception>

#include "commands.h"
#include "pathkernel/context.h"

int main(int argc, char** argv) {
  pathkernel::reexec_with_passive_openmp(argv);
#ifdef PATHKERNEL_TEST_HOOKS
  pathkernel::cli::install_test_write_hook();
#endif
  try {
    return pathkernel::cli::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pathkernel: error: %s\n", e.what());
    return 1;
  }
}
