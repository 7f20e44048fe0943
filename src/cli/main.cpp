// pathkernel's entry point: run the application, report user errors.
#include <cstdio>
#include <exception>
#include <string>

#include "commands.h"
#include "pathkernel/context.h"
#include "pathkernel/distributed.h"
#include "../program/allocator.h"

int main(int argc, char** argv) {
  pathkernel::reexec_with_library_environment(argc, argv);
  pathkernel::program::set_up_allocator();
#ifdef PATHKERNEL_TEST_HOOKS
  pathkernel::cli::install_test_write_hook();
#endif
  // Under mpirun every rank runs this same program on its share; alone, one rank.
  pathkernel::DistributedSession session(&argc, &argv);
  const pathkernel::Communicator& world = pathkernel::Communicator::world();
  try {
    pathkernel::cli::check_same_arguments(world, argc, argv);
    return pathkernel::cli::run(argc, argv);
  } catch (const pathkernel::AgreedError& e) {
    // Every rank has it: say it once.
    if (world.root()) std::fprintf(stderr, "pathkernel: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    if (world.size() == 1) {
      std::fprintf(stderr, "pathkernel: error: %s\n", e.what());
      return 1;
    }
    // This rank's alone: the others may be waiting for it in a collective.
    std::fprintf(stderr, "pathkernel: error: rank %d of %d: %s\n", world.rank(), world.size(), e.what());
    std::fflush(stderr);
    world.abort(1);
  }
}
