#pragma once
// Rows grouped by an int32 key (token ids): what a gradient that sums rows
// per key needs, in memory proportional to the rows, not to the key range.
// group_by_key(ctx, keys, n, groups, temp) fills, on the backend, with no host sync:
//   rows     [n]      the row indices sorted by key; rows of one key in row order (a stable sort)
//   keys     [n]      each group's key, in ascending order (the first *count are valid)
//   offsets  [n + 1]  group g's rows are rows[offsets[g] .. offsets[g + 1])
//   count    [1]      the number of groups, in backend memory
// temp holds group_by_key_bytes(ctx, n) bytes. The result is the same on
// every backend; a sum over a group in its row order is deterministic.
#include <cstdint>

namespace amp {

struct KeyGroups {
  std::int32_t* rows;
  std::int32_t* keys;
  std::int32_t* offsets;
  std::int32_t* count;
};

}  // namespace amp
