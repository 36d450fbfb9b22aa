#!/usr/bin/env bash
# The GPU check, as one command on a GPU machine that has the CUDA toolkit,
# CMake, ninja and Python with PyTorch, but no Debian packages and no network:
#
#   scripts/gpu-check.sh prepare    here (development machine): put what that machine
#                                   lacks into .gpu-carry/ (git-ignored; it travels
#                                   with the tree) and check it fits the budget
#   scripts/gpu-check.sh            there: build for sm_90 with all cores, run every
#                                   test (none may skip), compute-sanitizer over the
#                                   CUDA tests, the GPU benchmarks and PyTorch's AMP
#                                   on the same recipe; one summary at the end
#   scripts/gpu-check.sh --dry-run  here (and in CI): prepare, configure and build for
#                                   sm_90 from the carried files only, and list what
#                                   would run
#
# Each stage has its own time limit, so a hang cannot eat the machine's call.
set -uo pipefail
source "$(dirname "$0")/env.sh"
carry="$AMP_ROOT/.gpu-carry"
budget_mib=48
build="$AMP_ROOT/build-gpu"
out=${OUT:-$AMP_ROOT/out/gpu-check}
mode=${1:-run}

prepare() {
  "$AMP_ROOT/scripts/setup.sh" >/dev/null || return 1
  rm -rf "$carry" && mkdir -p "$carry/include" "$carry/lib" "$carry/data"
  cp -r /usr/include/doctest "$carry/include/"                      # header-only test framework
  cp /usr/include/zlib.h /usr/include/zconf.h "$carry/include/"    # amp::data's headers
  cp -L /usr/lib/x86_64-linux-gnu/libz.so.1 "$carry/lib/"
  ln -sf libz.so.1 "$carry/lib/libz.so"
  # oneDNN (amp::host) and the OpenCL loader it links, xz-compressed: 40 MB -> a few.
  xz -9 -T0 -c "$(readlink -f /usr/lib/x86_64-linux-gnu/libdnnl.so.2)" >"$carry/lib/libdnnl.so.2.xz"
  cp -L /usr/lib/x86_64-linux-gnu/libOpenCL.so.1 "$carry/lib/"
  # Fashion-MNIST, reduced: the whole test set and the first 10000 training images.
  /usr/bin/python3 - /usr/share/datasets/fashion-mnist "$carry/data" <<'PY' || return 1
import gzip, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
    shutil.copy(f"{src}/{name}", f"{dst}/{name}")
for name, item in (("train-images-idx3-ubyte", 784), ("train-labels-idx1-ubyte", 1)):
    raw = gzip.open(f"{src}/{name}.gz").read()
    header = 16 if item > 1 else 8
    head = bytearray(raw[:header])
    head[4:8] = (10000).to_bytes(4, "big")
    with gzip.open(f"{dst}/{name}.gz", "wb") as f:
        f.write(bytes(head) + raw[header:header + 10000 * item])
PY
  # The fortunes text for char_lm (a few MiB of files without an extension).
  mkdir -p "$carry/data/fortunes"
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$carry/data/fortunes/" \;
  local kib
  kib=$(du -sk "$carry" | cut -f1)
  echo "gpu-check: carry $(( kib / 1024 )) MiB of $budget_mib MiB ($carry)"
  du -sh "$carry"/* | sed 's/^/  /'
  if (( kib > budget_mib * 1024 )); then
    echo "gpu-check: the carry is over its budget of $budget_mib MiB" >&2
    return 1
  fi
}

# oneDNN unpacked beside its archive (the GPU machine has Python, not always xz).
unpack() {
  [ -f "$carry/lib/libdnnl.so.2" ] && return 0
  python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" \
    "$carry/lib/libdnnl.so.2.xz" "$carry/lib/libdnnl.so.2" && ln -sf libdnnl.so.2 "$carry/lib/libdnnl.so"
}

configure() {
  # The carry comes first on every search path, and Debian's doctest package is
  # not asked for, so the build uses the carried files only.
  cmake -S "$AMP_ROOT" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DCMAKE_PREFIX_PATH="$carry" -DCMAKE_INCLUDE_PATH="$carry/include" -DCMAKE_LIBRARY_PATH="$carry/lib" \
        -DCMAKE_DISABLE_FIND_PACKAGE_doctest=ON -DAMP_DATA_DIR="$carry/data" \
        -DAMP_FORTUNES_DIR="$carry/data/fortunes" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
}

# Nothing in the build may come from a Debian package the GPU machine lacks.
check_carried_only() {
  local pattern='/usr/(include|lib/x86_64-linux-gnu)/(doctest|zlib\.h|zconf\.h|oneapi|dnnl|cblas|openblas|libdnnl|libz\.|libOpenCL)[^ :]*'
  local bad
  bad=$( (ninja -C "$build" -t deps; cat "$build/build.ninja" "$build/CMakeCache.txt") 2>/dev/null |
        grep -oE "$pattern" | sort -u)
  if [ -n "$bad" ]; then
    echo "gpu-check: the build used files the GPU machine does not have:" >&2
    echo "$bad" | sed 's/^/  /' >&2
    return 1
  fi
  echo "gpu-check: the build uses the carried files only"
}

stage() {  # stage NAME SECONDS COMMAND...: runs with a time limit, logs to $out/NAME.log
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( SECONDS - start )) s" | tee -a "$out/stages.txt"
  [ $rc -eq 124 ] && echo "$name: TIMED OUT after $limit s" | tee -a "$out/stages.txt"
  return $rc
}

if [ "$mode" = "prepare" ]; then
  prepare
  exit $?
fi

if [ "$mode" = "--dry-run" ]; then
  start=$SECONDS
  prepare || exit 1
  unpack || exit 1
  export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
  configure >/dev/null || { echo "gpu-check: configure failed" >&2; exit 1; }
  cmake --build "$build" -j "$AMP_JOBS" >"$build/build.log" 2>&1 || { tail -40 "$build/build.log"; exit 1; }
  check_carried_only || exit 1
  echo "gpu-check --dry-run: built for sm_90 in $(( SECONDS - start )) s. On the GPU machine it would run:"
  echo "  tests:      $(cd "$build" && ctest -N | tail -1)"
  echo "  sanitizer:  compute-sanitizer memcheck on $(ls "$build"/tests/amp_cuda_*_tests | xargs -n1 basename | tr '\n' ' ')"
  echo "              racecheck on amp_cuda_backend_tests (the reductions)"
  echo "  benchmarks: $(ls "$AMP_ROOT"/bench/gpu-*.sh | xargs -n1 basename | tr '\n' ' ')"
  echo "  PyTorch:    bench/pytorch_fashion_mnist.py and bench/pytorch_char_lm.py on cuda: fp32, fp16 autocast +"
  echo "              GradScaler, bf16 autocast"
  exit 0
fi

# --- on the GPU machine --------------------------------------------------------
[ -d "$carry" ] || { echo "gpu-check: no $carry: run 'scripts/gpu-check.sh prepare' first" >&2; exit 1; }
mkdir -p "$out" && : >"$out/stages.txt"
export LD_LIBRARY_PATH="$carry/lib:${LD_LIBRARY_PATH:-}"
export AMP_JOBS=$(nproc)
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1
unpack
stage configure 120 configure
stage build 330 cmake --build "$build" -j "$AMP_JOBS"
stage tests 150 bash -c "cd '$build' && ctest -j 8 --timeout 120 --output-on-failure"
if command -v compute-sanitizer >/dev/null; then
  for t in "$build"/tests/amp_cuda_*_tests; do
    stage "memcheck-$(basename "$t")" 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$t"
  done
  stage "racecheck-amp_cuda_backend_tests" 60 compute-sanitizer --tool racecheck --error-exitcode 9 \
    "$build/tests/amp_cuda_backend_tests" --test-case='*reduce*'
else
  echo "sanitizer: compute-sanitizer not found: skipped" | tee -a "$out/stages.txt"
fi
for runner in "$AMP_ROOT"/bench/gpu-*.sh; do
  stage "$(basename "$runner" .sh)" 150 bash "$runner" "$build" "$out" "$carry/data"
done
python3 "$AMP_ROOT/scripts/gpu_summary.py" "$out" "$build"
