#pragma once
// --distributed for the examples: this process as one rank of an MPI job
// (mpirun -np N ... --distributed yes). An example built without amp::parallel
// refuses the flag. The communicator a level trains over is common/device.hpp's.
#include <optional>

#include <amp/core/error.hpp>
#if defined(AMP_EXAMPLE_PARALLEL)
#include <amp/parallel/mpi.hpp>
#endif

namespace examples {

struct Distributed {
  int rank = 0, ranks = 1;
#if defined(AMP_EXAMPLE_PARALLEL)
  std::optional<amp::parallel::MpiEnvironment> mpi;
  std::optional<amp::parallel::MpiCommunicator> comm;
#endif
  bool leader() const { return rank == 0; }

  void start(int& argc, char**& argv, const char* program) {
#if defined(AMP_EXAMPLE_PARALLEL)
    (void)program;
    mpi.emplace(argc, argv);
    comm.emplace();
    rank = comm->rank(), ranks = comm->size();
#else
    (void)argc, (void)argv;
    amp::fail("--distributed: ", program, " was built without MPI (install libopenmpi-dev and rebuild)");
#endif
  }
  // The CPU threads of this rank: --threads, or the machine's cores shared out among the ranks.
  int threads(int asked) const {
#if defined(AMP_EXAMPLE_PARALLEL)
    if (comm && asked == 0) return amp::parallel::threads_per_rank(*comm);
#endif
    return asked;
  }
  // After an error on one rank: the whole job ends instead of the others waiting in a collective.
  void abort_job() {
#if defined(AMP_EXAMPLE_PARALLEL)
    if (mpi && ranks > 1) mpi->abort(2);
#endif
  }
};

// This process's place in the job: one per process, shared by a program's translation units.
inline Distributed dist;

}  // namespace examples
