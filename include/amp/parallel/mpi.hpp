#pragma once
// MPI for amp: the process's MPI environment, and a Collective over host
// memory (the host backend's data parallel; also what bootstraps NCCL).
// Launch: mpirun -np 2 ./prog (one machine), mpirun -H a,b -np 2 ./prog (two).
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <thread>
#include <vector>

#include "amp/backend/collective.hpp"
#include "amp/backend/host.hpp"
#include "amp/backend/host/convert.hpp"

namespace amp::parallel {

namespace detail {
inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(rc, text, &length);
  fail("MPI: ", call, " failed: ", text);
}

// MPI has no fp16/bf16 sum: an op that adds in fp32 and rounds once per
// addition, in blocks through the CPU's bulk conversions (the same rounding as amp::cast).
template <class T>
void sum_16bit(void* in, void* inout, int* length, MPI_Datatype*) {
  constexpr std::size_t block = 2048;
  float a[block], b[block];
  const T* x = static_cast<const T*>(in);
  T* y = static_cast<T*>(inout);
  for (std::size_t at = 0, n = static_cast<std::size_t>(*length); at < n; at += block) {
    const std::size_t m = std::min(block, n - at);
    amp::detail::convert_n(x + at, a, m);
    amp::detail::convert_n(y + at, b, m);
    for (std::size_t i = 0; i < m; ++i) b[i] += a[i];
    amp::detail::convert_n(b, y + at, m);
  }
}

// MPI counts are ints: large buffers go in chunks.
inline constexpr std::size_t max_chunk = std::size_t{1} << 30;
}  // namespace detail

// MPI_Init_thread ... MPI_Finalize, once per process (main thread calls MPI).
// A rank that fails calls abort() (or leaves by an exception): the job ends on
// every rank at once instead of the others waiting in a collective forever.
class MpiEnvironment {
 public:
  MpiEnvironment(int& argc, char**& argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    AMP_REQUIRE(!initialized, "MpiEnvironment: MPI is already initialised (one environment per process)");
    int provided = 0;
    detail::mpi_check(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;
  ~MpiEnvironment() {
    if (std::uncaught_exceptions() > 0) abort(1);
    MPI_Finalize();
  }

  // Ends the whole job (after this rank has said why).
  [[noreturn]] void abort(int code) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
};

// Collectives over host memory on a private duplicate of `parent`, so amp's
// traffic never interleaves with the application's; errors are amp::Errors.
class MpiCommunicator final : public Collective<host> {
 public:
  explicit MpiCommunicator(MPI_Comm parent = MPI_COMM_WORLD) {
    detail::mpi_check(MPI_Comm_dup(parent, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(&detail::sum_16bit<half>, 1, &sum_fp16_);
    MPI_Op_create(&detail::sum_16bit<bfloat16>, 1, &sum_bf16_);
  }
  ~MpiCommunicator() override {
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    MPI_Op_free(&sum_fp16_);
    MPI_Op_free(&sum_bf16_);
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm comm() const { return comm_; }

  // Each call is one launch of the context (Context<host>::issue): a captured
  // step records it and its replays run it, as a CUDA graph holds NCCL's.
  void all_reduce_sum(Context<host>& ctx, void* data, std::size_t count, element type) override {
    ctx.issue([this, data, count, type] {
      each_chunk(data, count, type, [&](void* at, int n) {
        detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, at, n, datatype(type), op(type), comm_), "MPI_Allreduce");
      });
    });
  }
  void start_all_reduce_sum(Context<host>& ctx, void* data, std::size_t count, element type) override {
    start_all_reduce(ctx, data, count, type, op(type));
  }
  void start_all_reduce_max(Context<host>& ctx, float* data, std::size_t count) override {
    start_all_reduce(ctx, data, count, element::fp32, MPI_MAX);
  }
  void finish(Context<host>& ctx) override {
    ctx.issue([this] {
      if (requests_.empty()) return;
      const int rc = MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
      requests_.clear();
      detail::mpi_check(rc, "MPI_Waitall");
    });
  }
  void progress() override {
    if (requests_.empty()) return;
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    if (done) requests_.clear();
  }
  void start_reduce_sum(Context<host>& ctx, void* data, std::size_t count, element type, int root) override {
    ctx.issue([this, data, count, type, root] {
      each_chunk(data, count, type, [&](void* at, int n) {
        MPI_Request r;
        const bool mine = root == rank_;
        detail::mpi_check(MPI_Ireduce(mine ? MPI_IN_PLACE : at, mine ? at : nullptr, n, datatype(type), op(type), root,
                                      comm_, &r),
                          "MPI_Ireduce");
        requests_.push_back(r);
      });
    });
  }
  void all_gather(Context<host>& ctx, void* data, std::size_t bytes) override {
    AMP_REQUIRE(bytes <= detail::max_chunk, "MpiCommunicator::all_gather: slots of at most 1 GiB");
    ctx.issue([this, data, bytes] {
      const int n = static_cast<int>(bytes);
      detail::mpi_check(MPI_Allgather(MPI_IN_PLACE, n, MPI_BYTE, data, n, MPI_BYTE, comm_), "MPI_Allgather");
    });
  }
  void broadcast(Context<host>& ctx, void* data, std::size_t bytes, int root) override {
    ctx.issue([this, data, bytes, root] { broadcast_bytes(data, bytes, root); });
  }
  // Host bytes from root to every rank (also what bootstraps NCCL).
  void broadcast_bytes(void* data, std::size_t bytes, int root) {
    for (std::size_t at = 0; at < bytes; at += detail::max_chunk) {
      const int n = static_cast<int>(std::min(detail::max_chunk, bytes - at));
      detail::mpi_check(MPI_Bcast(static_cast<char*>(data) + at, n, MPI_BYTE, root, comm_), "MPI_Bcast");
    }
  }
  std::vector<std::int64_t> all_gather(std::int64_t value) override {
    std::vector<std::int64_t> out(static_cast<std::size_t>(size_));
    detail::mpi_check(MPI_Allgather(&value, 1, MPI_INT64_T, out.data(), 1, MPI_INT64_T, comm_), "MPI_Allgather");
    return out;
  }

 private:
  void start_all_reduce(Context<host>& ctx, void* data, std::size_t count, element type, MPI_Op reduction) {
    ctx.issue([this, data, count, type, reduction] {
      each_chunk(data, count, type, [&](void* at, int n) {
        MPI_Request r;
        detail::mpi_check(MPI_Iallreduce(MPI_IN_PLACE, at, n, datatype(type), reduction, comm_, &r), "MPI_Iallreduce");
        requests_.push_back(r);
      });
    });
  }
  static MPI_Datatype datatype(element t) { return t == element::fp32 ? MPI_FLOAT : MPI_UINT16_T; }
  MPI_Op op(element t) const { return t == element::fp32 ? MPI_SUM : t == element::fp16 ? sum_fp16_ : sum_bf16_; }
  template <class F>
  static void each_chunk(void* data, std::size_t count, element type, F&& f) {
    for (std::size_t at = 0; at < count; at += detail::max_chunk)
      f(static_cast<char*>(data) + at * element_size(type), static_cast<int>(std::min(detail::max_chunk, count - at)));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Op sum_fp16_ = MPI_OP_NULL, sum_bf16_ = MPI_OP_NULL;
  std::vector<MPI_Request> requests_;
};

// CPU threads for each rank of comm on this machine: the cores shared out
// evenly (mpirun -np 2 on 2 cores: one each), so ranks do not oversubscribe them.
inline int threads_per_rank(const MpiCommunicator& comm) {
  MPI_Comm local;
  detail::mpi_check(MPI_Comm_split_type(comm.comm(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local),
                    "MPI_Comm_split_type");
  int here = 1;
  MPI_Comm_size(local, &here);
  MPI_Comm_free(&local);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / here);
}

}  // namespace amp::parallel
