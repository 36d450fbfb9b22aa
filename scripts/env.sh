# Sourced by the scripts: nvcc from the default toolkit location, the build folder.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
AMP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AMP_BUILD=${AMP_BUILD:-$AMP_ROOT/build}
AMP_JOBS=${AMP_JOBS:-$(nproc)}

# Configures the build folder; a new one with Ninja, whose log times each
# translation unit (bench/compile_time.sh reads it).
amp_configure() {
  local generator=()
  [ -f "$AMP_BUILD/CMakeCache.txt" ] || generator=(-G Ninja)
  cmake -S "$AMP_ROOT" -B "$AMP_BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
}
