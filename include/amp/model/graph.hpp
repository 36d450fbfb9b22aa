#pragma once
// The graph of one training iteration: a tape. Each op writes its outputs into
// the graph's memory and records what its backward needs (by value, in a
// closure), so layers hold no per-call state: a layer called twice (shared
// weights), an output read by two ops (gradients add), several inputs, several
// losses, several forwards of one model before one backward (a GAN's
// discriminator on the real and the fake batch), all are ordinary. backward()
// runs the closures of every forward of the iteration, last recorded first;
// each adds its input gradients where the graph says (the first contribution
// writes, later ones add).
//
// Iterations: a forward joins the iteration in progress while that iteration
// holds a training-mode forward whose backward has not run (up to
// ModelOptions::forwards_per_iteration forwards, so an evaluation forward may
// join a training iteration); otherwise it starts a new iteration, which drops
// the old tape, gradients and memory.
// Every tensor knows its iteration, and a tensor of an iteration that is gone
// is an error, never another forward's values.
//
// Memory: a bump arena, sized once when the model is built by a planning pass
// of ModelOptions::forwards_per_iteration forwards at the largest batch (see
// Model); afterwards a forward or a backward allocates nothing. Ops that the
// plan did not see (on the outputs of several forwards, say) get a spill block
// at their first iteration, kept for the later ones.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/backend/algorithm.hpp"
#include "amp/backend/buffer.hpp"
#include "amp/model/parameters.hpp"
#include "amp/model/tape.hpp"
#include "amp/model/var.hpp"
#include "amp/tensor.hpp"

namespace amp::nn {

namespace detail {
struct GraphHooks;
struct CountForwardOp {
  std::uint64_t* forwards;
  AMP_HOST_DEVICE void operator()(std::size_t) const { ++*forwards; }
};

}  // namespace detail

template <Policy P, Backend B>
class Graph {
 public:
  using policy = P;
  using backend = B;
  using T = typename P::activation_type;
  static constexpr std::size_t alignment = 256;
  static constexpr int max_losses = 64;

  Graph(Context<B>& ctx, ParameterStore<P, B>& params, std::uint64_t seed = 0)
      : ctx_(&ctx), params_(&params), seed_(seed), losses_(ctx, max_losses, memory_kind::activations),
        forwards_run_(ctx, 1, memory_kind::activations) {
    fill(ctx, forwards_run_.span(), std::uint64_t{0});
  }
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  Context<B>& context() const { return *ctx_; }
  ParameterStore<P, B>& params() const { return *params_; }

  // The build-time pass that sizes memory: ops run as usual on zeros, but
  // leave no trace (no running statistics, no random stream advanced).
  bool planning() const { return planning_; }
  // The iteration in progress, from 1 (planning has its own).
  std::uint64_t iteration() const { return iteration_; }
  bool training() const { return training_; }
  void set_training(bool on) { training_ = on; }

  // A new tensor on the graph; differentiable ones can receive a gradient.
  template <class U>
  Var<U> tensor(Shape shape, bool differentiable = true) {
    Var<U> v{scratch<U>(static_cast<std::size_t>(shape.numel())), shape, -1, iteration_};
    if (differentiable) {
      v.id = static_cast<int>(grads_.size());
      grads_.push_back({nullptr, v.size() * sizeof(U)});
    }
    return v;
  }

  // Memory that lives until the next forward: saved tensors, temporaries.
  template <class U>
  U* scratch(std::size_t count) {
    return static_cast<U*>(allocate(count * sizeof(U)));
  }

  // Records f(graph), run during backward, last recorded first.
  template <class F>
  void on_backward(F&& f) {
    recording_->push(std::forward<F>(f));
  }

  // Throws unless v belongs to this graph's iteration in progress; `who` names
  // the handle or the op that holds it.
  template <class U, class... Who>
  void require_current(const Var<U>& v, const Who&... who) const {
    require_iteration(v, who...);
    for (const auto& [data, by] : overwritten_)
      if (v.data == data)
        fail(who..., ": tensor ", v.shape.str(), " holds its gradient now: ", by,
             " wrote dL/dx over its values (read a fused loss's logits before the loss, or use cross_entropy)");
  }
  // The iteration check alone: a tensor whose memory now holds its gradient passes.
  template <class U, class... Who>
  void require_iteration(const Var<U>& v, const Who&... who) const {
    if (v.iteration == iteration_) return;
    fail(who..., ": tensor ", v.shape.str(), " is from iteration ", v.iteration, " of its graph, which is now at ",
         planning_ ? "its planning pass" : "iteration ", planning_ ? "" : std::to_string(iteration_),
         v.iteration == 0 ? " (a tensor not made by a graph)" : "",
         " (a forward after a backward, or past ModelOptions::forwards_per_iteration, starts a new iteration and "
         "drops the old one's tensors)");
  }

  // dL/dv so far, or nullptr when no gradient reached v.
  template <class U>
  const U* grad(const Var<U>& v) const {
    require_iteration(v, "Graph::grad");
    return v.id < 0 ? nullptr : static_cast<const U*>(grads_[static_cast<std::size_t>(v.id)].data);
  }
  // Where a contribution to dL/dv goes (allocated at the first one); empty
  // for tensors that take no gradient.
  template <class U>
  GradOut<U> grad_out(const Var<U>& v) {
    return claim_grad(v, static_cast<U*>(nullptr), "Graph::grad_out");
  }

  // dL/dv lives in v's memory, already written: the first contribution, or
  // {the gradient so far, accumulate} when another loss seeded one.
  template <class U>
  GradOut<U> grad_in_place(const Var<U>& v) {
    return claim_grad(v, v.data, "Graph::grad_in_place");
  }

  // A fresh slot for a loss value: two losses of one iteration never share one.
  LossValue* loss_slot() {
    AMP_REQUIRE(loss_count_ < max_losses, "Graph: more than ", max_losses, " losses in one iteration");
    return losses_.data() + loss_count_++;
  }

  // A random stream for an op of this forward (dropout): the same bits on
  // every backend for the same seed, forward and op.
  detail::RandomStream random_stream() { return {forwards_run_.data(), seed_, stream_++}; }

  // Forwards run so far (one sync): with the seed, what the random streams
  // (dropout) depend on. Counted in backend memory, by each forward.
  std::uint64_t forward_count() const {
    return download_one(*ctx_, static_cast<const std::uint64_t*>(forwards_run_.data()));
  }
  void set_forward_count(std::uint64_t n) { upload(*ctx_, forwards_run_.span(), &n, 1); }

  // Starts a forward: it joins the iteration in progress while that holds a
  // training-mode forward not yet back-propagated and has room for it, else
  // it starts a new one. A forward past forwards_per_iteration abandons the
  // pending iteration: its tensors are then stale, an error when used.
  void begin_forward() {
    if (!open() || (forwards_ >= forwards_planned_ && !planning_)) start_iteration();
    ++forwards_;
    has_training_forward_ = has_training_forward_ || training_ || planning_;
    stream_ = 0;
    if (!planning_) for_each(*ctx_, 1, detail::CountForwardOp{forwards_run_.data()});
  }
  // Forwards in the iteration in progress.
  int forwards() const { return forwards_; }

  // Runs the backward closures of every forward of the iteration, last recorded
  // first. Once per iteration. `scaled`: the seeds carry the loss scale.
  void backward(bool scaled = true) {
    AMP_REQUIRE(forwards_ > 0, "backward(): no forward ran in this iteration");
    AMP_REQUIRE(!backward_done_, "backward() ran twice on iteration ", iteration_,
                ": each iteration is back-propagated once (to back-propagate several losses, sum them: "
                "(a + b).backward())");
    backward_done_ = true;
    BackwardObserver* watch = planning_ ? nullptr : params_->observer();
    if (watch) {
      watch->backward_begin();
      tape_.run_backward(*this, [watch] { watch->op_done(); });
      watch->backward_end();
    } else {
      tape_.run_backward(*this, [] {});
    }
    if (!planning_) params_->note_backward(scaled);
  }
  bool backward_done() const { return backward_done_; }

  // The planning pass (Model's constructor): memory grows as ops ask, and the
  // total becomes the arena's size; `forwards` forwards may join one iteration.
  void begin_planning(int forwards) {
    planning_ = true;
    forwards_planned_ = forwards;
    blocks_.clear();  // a second planning pass measures afresh
    planned_bytes_ = 0;
    start_iteration();
  }
  void end_planning() {
    planning_ = false;
    const std::size_t needed = planned_bytes_;
    tape_.clear();
    grads_.clear();
    chunks_.clear();
    blocks_.clear();
    blocks_.emplace_back(*ctx_, std::max<std::size_t>(needed, alignment), memory_kind::activations);
    start_iteration();  // the planning pass's tensors are gone
  }
  // Temporaries: memory allocated after mark() is given back by release(mark).
  struct Mark {
    std::size_t block, offset;
  };
  Mark mark() const { return {block_, offset_}; }
  void release(Mark m) {
    block_ = m.block, offset_ = m.offset;
    while (!chunks_.empty() && chunks_.back().offset >= m.offset) chunks_.pop_back();
  }

  // A segment of the tape is being replayed (activation checkpointing): ops record no statistics twice.
  bool replaying() const { return replaying_; }

  // Bytes the arena holds: what the planning pass measured, and any spill blocks.
  std::size_t arena_bytes() const {
    std::size_t total = 0;
    for (const auto& b : blocks_) total += b.bytes();
    return total;
  }
  std::size_t bytes_in_use() const {
    std::size_t total = offset_;
    for (std::size_t k = 0; k < block_; ++k) total += blocks_[k].bytes();
    return total;
  }

 private:
  friend struct detail::GraphHooks;  // model/graph_hooks.hpp

  // Gradients in place (a fused loss writes dL/dlogits over the logits). The
  // op that made v says its backward never reads v's values (after recording
  // that backward); overwrite(v) then claims v's memory for its gradient, while
  // no backward was recorded since (no other op can have saved v), and reading
  // v becomes an error.
  template <class U>
  void allow_overwrite(const Var<U>& v) {
    overwritable_ = v.data, overwritable_tape_ = tape_.size();
  }
  template <class U>
  void overwrite(const Var<U>& v, const char* who) {
    require_current(v, who);
    AMP_REQUIRE(v.data == overwritable_ && tape_.size() == overwritable_tape_, who, ": the logits ", v.shape.str(),
                " must come straight from a Linear without activation or Embedding::logits, as the last op of "
                "the forward, read by no other op (their memory becomes the gradient)");
    AMP_REQUIRE(v.id >= 0 && !grads_[static_cast<std::size_t>(v.id)].data, who, ": the logits ", v.shape.str(),
                " take no gradient, or have one already");
    overwritten_.emplace_back(v.data, who);
  }
  // --- activation checkpointing (nn/checkpoint.hpp) ---------------------------
  // A stretch of a forward: where its memory, closures and random streams begin.
  struct Segment {
    Mark memory;
    std::size_t tape;
    std::uint64_t stream;
  };
  Segment begin_segment() const { return {mark(), recording_->size(), stream_}; }
  // Forgets what the segment recorded: its backward closures and its memory.
  void drop_segment(const Segment& s) {
    recording_->truncate(s.tape);
    release(s.memory);
  }
  // In backward: forward() runs the segment's ops again (the same random
  // streams, so the same dropout masks; no running statistics or FP8 amaxes
  // recorded twice) and seeds their output's gradient; then their backward
  // runs, and the memory of both is given back. The gradients of tensors from
  // before the call must be claimed before it (they outlive its memory): one
  // claimed inside is an error.
  template <class F>
  void replay(const Segment& s, F&& forward) {
    if (depth_ == replay_tapes_.size()) replay_tapes_.push_back(std::make_unique<detail::Tape<Graph>>());
    detail::Tape<Graph>& tape = *replay_tapes_[depth_];
    const Mark m = mark();
    const std::size_t outer = grads_.size(), claimed = claimed_before(outer);
    struct Restore {  // also when the block throws
      Graph& g;
      detail::Tape<Graph>& tape;
      detail::Tape<Graph>* recording;
      std::uint64_t stream;
      bool replaying;
      ~Restore() {
        tape.clear();
        g.recording_ = recording, g.stream_ = stream, g.replaying_ = replaying, --g.depth_;
      }
    } restore{*this, tape, recording_, stream_, replaying_};
    ++depth_;
    recording_ = &tape, stream_ = s.stream, replaying_ = true;
    forward();
    recording_ = restore.recording;
    tape.run_backward(*this, [] {});
    AMP_REQUIRE(claimed_before(outer) == claimed, "checkpoint: the checkpointed block reads a tensor from outside it "
                "other than its input; make that tensor its input, or leave the block uncheckpointed");
    release(m);
  }
  // dL/dv is at g already (a replayed segment's output: the gradient its first run received).
  template <class U>
  void seed_grad(const Var<U>& v, const U* g) {
    require_iteration(v, "Graph::seed_grad");
    AMP_REQUIRE(v.id >= 0 && !grads_[static_cast<std::size_t>(v.id)].data, "Graph::seed_grad: tensor ",
                v.shape.str(), " takes no gradient, or has one already");
    grads_[static_cast<std::size_t>(v.id)].data = const_cast<U*>(g);
  }

  struct GradSlot {
    void* data;
    std::size_t bytes;
  };
  struct Chunk {
    std::size_t offset;
    Buffer<std::byte, B> memory;
  };

  // v's gradient slot: taken already (accumulate), or now at memory (nullptr: allocated).
  template <class U>
  GradOut<U> claim_grad(const Var<U>& v, U* memory, const char* who) {
    require_iteration(v, who);
    if (v.id < 0) return {};
    auto& g = grads_[static_cast<std::size_t>(v.id)];
    if (g.data) return {static_cast<U*>(g.data), true};
    g.data = memory ? memory : allocate(g.bytes);
    return {static_cast<U*>(g.data), false};
  }
  std::size_t claimed_before(std::size_t id) const {
    std::size_t n = 0;
    for (std::size_t k = 0; k < id; ++k) n += grads_[k].data != nullptr;
    return n;
  }
  // A backward is still to come for the iteration in progress.
  bool open() const { return has_training_forward_ && !backward_done_; }
  void start_iteration() {
    tape_.clear();
    grads_.clear();
    block_ = 0, offset_ = 0;
    loss_count_ = 0;
    forwards_ = 0;
    has_training_forward_ = backward_done_ = false;
    overwritable_ = nullptr;
    overwritten_.clear();
    ++iteration_;
  }

  void* allocate(std::size_t bytes) {
    bytes = (bytes + alignment - 1) / alignment * alignment;
    if (planning_) {
      planned_bytes_ = std::max(planned_bytes_, offset_ + bytes);
      offset_ += bytes;
      chunks_.push_back({offset_ - bytes, Buffer<std::byte, B>(*ctx_, bytes, memory_kind::activations)});
      return chunks_.back().memory.data();
    }
    if (offset_ + bytes > blocks_[block_].bytes()) {  // past the plan: the next block, made or grown once
      ++block_, offset_ = 0;
      if (block_ == blocks_.size() || blocks_[block_].bytes() < bytes)  // nothing of this iteration lives there yet
        spill(std::max(bytes, blocks_.front().bytes() / 4 + alignment));
    }
    void* at = blocks_[block_].data() + offset_;
    offset_ += bytes;
    return at;
  }
  void spill(std::size_t bytes) {
    Buffer<std::byte, B> b(*ctx_, bytes, memory_kind::activations);
    if (block_ == blocks_.size()) blocks_.push_back(std::move(b));
    else blocks_[block_] = std::move(b);
  }

  Context<B>* ctx_;
  ParameterStore<P, B>* params_;
  std::uint64_t seed_;
  bool planning_ = false, training_ = true, backward_done_ = false, has_training_forward_ = false;
  int forwards_ = 0, forwards_planned_ = 1;
  std::uint64_t iteration_ = 0;
  detail::Tape<Graph> tape_;
  detail::Tape<Graph>* recording_ = &tape_;                      // where on_backward records: tape_, or a replay's
  std::vector<std::unique_ptr<detail::Tape<Graph>>> replay_tapes_;  // one per nesting depth, reused
  std::size_t depth_ = 0;
  bool replaying_ = false;
  std::vector<GradSlot> grads_;
  std::vector<Buffer<std::byte, B>> blocks_;  // the planned arena, then spill blocks
  std::vector<Chunk> chunks_;  // planning only: one per allocation, freed as the arena will be
  std::size_t block_ = 0, offset_ = 0, planned_bytes_ = 0;
  Buffer<LossValue, B> losses_;
  int loss_count_ = 0;
  Buffer<std::uint64_t, B> forwards_run_;
  std::uint64_t stream_ = 0;
  const void* overwritable_ = nullptr;  // the tensor allow_overwrite() named, at tape size overwritable_tape_
  std::size_t overwritable_tape_ = 0;
  std::vector<std::pair<const void*, const char*>> overwritten_;  // memory holding its gradient, and who wrote it
};

}  // namespace amp::nn
