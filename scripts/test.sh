#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite; lists each skipped test with its reason.
# Extra arguments go to cmake's configure step (e.g. -DAMP_SANITIZE=ON).
set -euo pipefail
source "$(dirname "$0")/env.sh"
"$AMP_ROOT/scripts/setup.sh"

start=$(date +%s)
cmake -S "$AMP_ROOT" -B "$AMP_BUILD" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$AMP_BUILD" -j "$AMP_JOBS"
echo "test suite built in $(( $(date +%s) - start )) s"

status=0
(cd "$AMP_BUILD" && ctest -j "$AMP_JOBS" --output-on-failure) || status=$?

# ctest says that a test was skipped; the test itself said why.
log="$AMP_BUILD/Testing/Temporary/LastTest.log"
if [ -f "$log" ] && grep -q '^\[amp-skip\]' "$log"; then
  echo "skipped tests and why:"
  awk '/^[0-9]+\/[0-9]+ Testing: /{ name = substr($0, index($0, "Testing: ") + 9) }
       /^\[amp-skip\]/{ print "  " name ": " substr($0, 12) }' "$log"
fi
exit $status
