# Sourced by the char_lm benchmarks: CHAR_LM (the binary: given, or the build's, built now), out (BENCH_OUT or
# out/), dir (a scratch folder removed at exit) and py (Debian's python3, with matplotlib, where it exists).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ -z "${CHAR_LM:-}" ]; then
  source "$root/scripts/env.sh"
  "$root/scripts/setup.sh"
  cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target char_lm >/dev/null
  CHAR_LM=$AMP_BUILD/examples/char_lm
fi
out=${BENCH_OUT:-$root/out}
mkdir -p "$out"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
py=/usr/bin/python3  # elsewhere (the GPU machine) whatever python3 there is
[ -x "$py" ] || py=python3
