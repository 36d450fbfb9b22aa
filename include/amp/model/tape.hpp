#pragma once
// The tape of a graph (model/graph.hpp): its backward closures in host memory,
// in blocks reused from step to step, run last recorded first.
#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "amp/core/error.hpp"

namespace amp::nn::detail {

template <class G>
class Tape {
 public:
  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;
  ~Tape() { clear(); }

  template <class F>
  void push(F&& f) {
    using Fn = std::decay_t<F>;
    static_assert(alignof(Fn) <= alignof(std::max_align_t));
    void* at = place(sizeof(Fn));
    new (at) Fn(std::forward<F>(f));
    entries_.push_back({[](void* self, G& g) { (*static_cast<Fn*>(self))(g); },
                        [](void* self) { static_cast<Fn*>(self)->~Fn(); }, at});
  }
  template <class AfterEach>
  void run_backward(G& g, AfterEach&& after_each) {
    for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
      it->run(it->self, g);
      after_each();
    }
  }
  void clear() {
    truncate(0);
    block_ = 0;
    used_ = 0;
  }
  // Forgets the closures recorded after the first n (their storage is reused at clear()).
  void truncate(std::size_t n) {
    for (std::size_t k = n; k < entries_.size(); ++k) entries_[k].destroy(entries_[k].self);
    entries_.resize(std::min(n, entries_.size()));
  }
  std::size_t size() const { return entries_.size(); }

 private:
  static constexpr std::size_t block_bytes = 1 << 16;
  struct Entry {
    void (*run)(void*, G&);
    void (*destroy)(void*);
    void* self;
  };
  void* place(std::size_t bytes) {
    bytes = (bytes + alignof(std::max_align_t) - 1) / alignof(std::max_align_t) * alignof(std::max_align_t);
    AMP_REQUIRE(bytes <= block_bytes, "Graph: a backward closure of ", bytes, " bytes is too large");
    if (block_ < blocks_.size() && used_ + bytes > block_bytes) ++block_, used_ = 0;
    if (block_ == blocks_.size()) blocks_.push_back(std::make_unique<std::byte[]>(block_bytes));
    void* at = blocks_[block_].get() + used_;
    used_ += bytes;
    return at;
  }
  std::vector<Entry> entries_;
  std::vector<std::unique_ptr<std::byte[]>> blocks_;
  std::size_t block_ = 0, used_ = 0;
};

}  // namespace amp::nn::detail
