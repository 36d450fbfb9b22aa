# Sourced by the scripts: nvcc from the default toolkit location, the build folder.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
AMP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
AMP_BUILD=${AMP_BUILD:-$AMP_ROOT/build}
AMP_JOBS=${AMP_JOBS:-$(nproc)}
