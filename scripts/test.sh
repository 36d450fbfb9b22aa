#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; lists each skipped test with its reason.
# Extra arguments go to cmake's configure step (e.g. -DAMP_SANITIZE=ON).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$AMP_ROOT/scripts/setup.sh" python3-torch python3-venv  # the PyTorch interchange test

start=$(date +%s)
amp_configure -DAMP_EXAMPLES_CUDA=ON "$@"  # ON: the examples' GPU paths are compiled here, GPU or not
cmake --build "$AMP_BUILD" -j "$AMP_JOBS"
echo "test suite built in $(( $(date +%s) - start )) s"

status=0
(cd "$AMP_BUILD" && ctest -j "$AMP_JOBS" --output-on-failure) || status=$?

# ctest says that a test was skipped; the test itself said why: one line per reason.
log="$AMP_BUILD/Testing/Temporary/LastTest.log"
if [ -f "$log" ] && grep -q '^\[amp-skip\]' "$log"; then
  echo "skipped tests, by reason:"
  grep '^\[amp-skip\]' "$log" | sort | uniq -c | sed 's/\[amp-skip\] //; s/^ */  /; s/^\(  [0-9]*\) /\1 tests: /'
fi
exit $status
