#pragma once
// The steady-state contract the host, CUDA and data-parallel tests share:
// nothing happened that would stall the host or break a CUDA graph.
#include <doctest/doctest.h>

#include "amp/amp.hpp"

namespace amp::test {

inline void check_no_host_work(const Counters& d) {
  CHECK(d.syncs == 0);
  CHECK(d.allocations == 0);
  CHECK(d.frees == 0);
  CHECK(d.pageable_copies == 0);
}

}  // namespace amp::test
