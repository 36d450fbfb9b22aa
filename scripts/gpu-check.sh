#!/usr/bin/env bash
# The GPU check: build for sm_90 and run the whole suite with nothing skipped,
# then the benchmarks, printing one summary. Runs on a GPU machine that has the
# CUDA toolkit and CMake but no package registry: `scripts/gpu-check.sh prepare`
# (on the development machine) puts doctest's header and the host CBLAS into
# .gpu-carry/ (git-ignored), which travels with the tree.
set -uo pipefail
source "$(dirname "$0")/env.sh"
carry="$AMP_ROOT/.gpu-carry"

if [ "${1:-}" = "prepare" ]; then
  rm -rf "$carry" && mkdir -p "$carry/include" "$carry/lib"
  cp -r /usr/include/doctest "$carry/include/"
  cp /usr/include/x86_64-linux-gnu/cblas.h "$carry/include/" 2>/dev/null ||
    cp /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h "$carry/include/"
  cp /usr/include/x86_64-linux-gnu/openblas-pthread/openblas_config.h "$carry/include/" 2>/dev/null || true
  lib=$(readlink -f /usr/lib/x86_64-linux-gnu/libopenblas.so.0)
  cp "$lib" "$carry/lib/libopenblas.so.0"
  ln -sf libopenblas.so.0 "$carry/lib/libopenblas.so"
  # OpenBLAS's own runtime needs (gfortran), which a bare image may lack.
  for dep in $(ldd "$lib" | awk '/gfortran|quadmath/ { print $3 }'); do cp "$dep" "$carry/lib/"; done
  cp -r /usr/share/datasets/fashion-mnist "$carry/" 2>/dev/null || true
  du -sh "$carry"
  exit 0
fi

out=${OUT:-$AMP_ROOT/out}
export AMP_DATA=${AMP_DATA:-$carry/fashion-mnist}
mkdir -p "$out"
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader || true
start=$(date +%s)
cmake -S "$AMP_ROOT" -B "$AMP_ROOT/build-gpu" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$carry" -DCMAKE_INCLUDE_PATH="$carry/include" -DCMAKE_LIBRARY_PATH="$carry/lib" \
      >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build "$AMP_ROOT/build-gpu" -j "$AMP_JOBS" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"

(cd "$AMP_ROOT/build-gpu" && ctest -j 4 --output-on-failure 2>&1 | tee "$out/ctest.log" | tail -25)
skipped=$(grep -c '^\[amp-skip\]' "$AMP_ROOT/build-gpu/Testing/Temporary/LastTest.log" || true)
echo "gpu-check: tests skipped on the GPU machine: $skipped (must be 0)"

# Benchmarks and demos, where they exist, in one go.
for runner in "$AMP_ROOT"/bench/gpu-*.sh; do
  [ -x "$runner" ] && "$runner" "$AMP_ROOT/build-gpu" "$out"
done
[ "$skipped" = "0" ] && grep -q "100% tests passed" "$out/ctest.log"
