#pragma once
// --distributed for the examples: this process as one rank of an MPI job
// (mpirun -np N ... --distributed yes), and the communicator a level's context
// trains over: MPI's on the CPU, NCCL bootstrapped over MPI on the GPU. An
// example built without amp::parallel refuses the flag.
#include <optional>

#include <amp/amp.hpp>
#if defined(AMP_EXAMPLE_PARALLEL)
#include <amp/parallel.hpp>
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

  // f(comm): comm is this job's communicator for ctx, or nullptr when alone.
  template <amp::Backend B, class F>
  auto with_collective(amp::Context<B>& ctx, F&& f) {
#if defined(AMP_EXAMPLE_PARALLEL)
    if (comm) {
      if constexpr (std::is_same_v<B, amp::host>) {
        return f(static_cast<amp::Collective<B>*>(&*comm));
      } else {
#if defined(__CUDACC__)  // NCCL exists only under nvcc; a host-only build has no other backend
        amp::parallel::NcclCommunicator nccl(*comm, ctx);
        auto r = f(static_cast<amp::Collective<B>*>(&nccl));
        nccl.synchronize();
        return r;
#endif
      }
    }
#endif
    (void)ctx;
    return f(static_cast<amp::Collective<B>*>(nullptr));
  }
};

}  // namespace examples
