#pragma once
// The host work of each level's training loop after its first step, as a
// table (common/record.hpp's LoopCounters count it). No amp headers: a
// program's main prints it.
#include <cstdio>

namespace examples {

// The loop's host work per level as a table (rows with level, the *_in_loop
// counts, launches_per_step, graph_nodes and step_ms).
template <class Rows>
void print_loop_counters(const Rows& rows) {
  std::printf("\nafter the first step (zeros: the step can be one CUDA graph)\n");
  std::printf("%-8s %6s %7s %9s %9s %6s %9s\n", "level", "syncs", "allocs", "pageable", "launches", "nodes",
              "ms/step");
  for (const auto& r : rows)
    std::printf("%-8s %6lld %7lld %9lld %9lld %6lld %9.3f\n", r.level.c_str(), r.host_syncs_in_loop,
                r.allocations_in_loop, r.pageable_copies_in_loop, r.launches_per_step, r.graph_nodes, r.step_ms);
}

}  // namespace examples
