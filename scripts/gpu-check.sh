#!/usr/bin/env bash
# The GPU check in one call. The binaries are built here, for sm_90, and
# carried; the GPU machine (CUDA toolkit and PyTorch, no Debian packages, no
# network) only runs them:
#
#   scripts/gpu-check.sh prepare    here: build what the check runs (if not built),
#                                   and put into .gpu-carry/ (git-ignored) the
#                                   stripped binaries, every library they load that
#                                   the GPU machine may lack, and the data; check it
#                                   fits the budget (48 MiB)
#   scripts/gpu-check.sh            there (the device tool: carry .gpu-carry): the CUDA
#                                   tests (none may skip), each program eager and as a
#                                   captured CUDA graph, PyTorch's AMP on the same
#                                   recipes, compute-sanitizer; one summary
#   scripts/gpu-check.sh --dry-run  here and in CI: prepare, then start every carried
#                                   binary (--help, --list-test-cases) with the carried
#                                   libraries only, and run the summary on what that left
#
# On the GPU machine one deadline (GPU_CHECK_SECONDS, default 450) bounds the
# whole run: each stage gets what is left of it, so even when every stage hits
# its limit the call ends in time, and the summary is written into $OUT from
# whatever ran: summary.txt, results.json, logs.tar.gz.
set -uo pipefail
source "$(dirname "$0")/env.sh"
carry="$AMP_ROOT/.gpu-carry"
budget_mib=48
mode=${1:-run}
tests=(amp_cuda_backend_tests amp_cuda_training_tests amp_cuda_capture_tests)
programs=(seed_linear fashion_mnist char_lm row_ops)

# --- here: the carry ------------------------------------------------------------
# Libraries the GPU machine has: the C/C++ runtime and the CUDA toolkit's big
# ones (cuBLAS, NCCL, cuDNN, NVRTC: hundreds of MiB; there PyTorch's nvidia wheels hold
# them); everything else a binary loads is carried.
system_lib='^(linux-vdso|ld-linux|libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so'
toolkit_lib='^(libcublas|libcublasLt|libnccl|libcudnn|libnvrtc)\.so'

prepare() {
  local start=$SECONDS
  if [ ! -f "$AMP_BUILD/CMakeCache.txt" ]; then
    "$AMP_ROOT/scripts/setup.sh" >/dev/null || return 1
  fi
  amp_configure -DAMP_EXAMPLES_CUDA=ON || return 1  # the programs' GPU halves (the demo leaves them out without a GPU)
  grep -q '^CMAKE_CUDA_ARCHITECTURES:STRING=.*90' "$AMP_BUILD/CMakeCache.txt" ||
    { echo "gpu-check: $AMP_BUILD is not built for sm_90 (CMAKE_CUDA_ARCHITECTURES)" >&2; return 1; }
  cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target "${tests[@]}" "${programs[@]}" >/dev/null ||
    { echo "gpu-check: building the carried targets failed" >&2; return 1; }
  rm -rf "$carry" && mkdir -p "$carry/bin" "$carry/lib" "$carry/data/fortunes"
  local binaries=()
  for t in "${tests[@]}"; do binaries+=("$AMP_BUILD/tests/$t"); done
  for p in "${programs[@]}"; do binaries+=("$(find "$AMP_BUILD/examples" "$AMP_BUILD/bench" -maxdepth 1 -name "$p" -type f)"); done
  local libs
  libs=$(for b in "${binaries[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  while read -r name path; do
    [[ "$name" =~ $system_lib || "$name" =~ $toolkit_lib ]] && continue
    cp -L "$path" "$carry/lib/$name"
  done <<<"$libs"
  for b in "${binaries[@]}"; do strip -o "$carry/bin/$(basename "$b")" "$b"; done
  # Big files travel xz-compressed (the GPU machine unpacks them with Python's lzma).
  find "$carry/bin" "$carry/lib" -type f -size +1M -exec xz -9 -T0 {} \;
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
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.*' -exec cp {} "$carry/data/fortunes/" \;
  local kib
  kib=$(du -sk "$carry" | cut -f1)
  echo "gpu-check: carry $(( kib / 1024 )).$(( kib % 1024 * 10 / 1024 )) MiB of $budget_mib MiB, made in $(( SECONDS - start )) s:"
  du -sh "$carry"/* | sed 's/^/  /'
  if (( kib > budget_mib * 1024 )); then
    echo "gpu-check: the carry is over its budget of $budget_mib MiB" >&2
    return 1
  fi
}

# --- both: unpacking and the library path -------------------------------------------
unpack() {
  python3 - "$carry" <<'PY' || return 1
import lzma, os, shutil, sys
for folder in ("bin", "lib"):
    root = os.path.join(sys.argv[1], folder)
    for name in os.listdir(root):
        if name.endswith(".xz"):
            target = os.path.join(root, name[:-3])
            with lzma.open(os.path.join(root, name)) as f, open(target, "wb") as out:
                shutil.copyfileobj(f, out)
            os.chmod(target, 0o755)
            os.remove(os.path.join(root, name))
PY
}

# The carried libraries first, then wherever the toolkit's cuBLAS, NCCL and cuDNN are
# (the toolkit's folders, or PyTorch's nvidia wheels).
library_path() {
  local dirs="$carry/lib"
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    [ -d "$d" ] && dirs+=":$d"
  done
  local wheels
  wheels=$(python3 -c 'import glob, os, site
for p in site.getsitepackages():
    for lib in glob.glob(os.path.join(p, "nvidia", "*", "lib")):
        print(lib)' 2>/dev/null | tr '\n' ':')
  echo "$dirs:${wheels%:}"
}

# --- here and in CI: the dry run ------------------------------------------------------
if [ "$mode" = "prepare" ]; then
  prepare
  exit $?
fi

if [ "$mode" = "--dry-run" ]; then
  start=$SECONDS
  prepare || exit 1
  # Unpacked in a copy: .gpu-carry stays packed, ready to carry.
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cp -r "$carry" "$scratch/carry" && carry=$scratch/carry
  unpack || exit 1
  export LD_LIBRARY_PATH="$carry/lib"  # and nothing else: what is not carried must be the system's or the toolkit's
  failed=0
  for b in "$carry"/bin/*; do
    name=$(basename "$b")
    outside=$(ldd "$b" | awk '$2 == "=>" {print $1, $3}' |
              while read -r lib path; do
                [[ "$path" == "$carry/lib/"* || "$lib" =~ $system_lib || "$lib" =~ $toolkit_lib ]] || echo "$lib ($path)"
              done)
    if [ -n "$outside" ]; then
      echo "gpu-check: $name loads libraries that are not carried: $outside" >&2
      failed=1
    fi
    if [[ "$name" == amp_*_tests ]]; then args=(--list-test-cases); else args=(--help); fi
    if ! "$b" "${args[@]}" >/dev/null 2>"$carry/start.err"; then
      echo "gpu-check: $name does not start with the carried libraries: $(tail -3 "$carry/start.err")" >&2
      failed=1
    fi
  done
  (( failed )) && exit 1
  # The summary on an output folder as a run that started nothing would leave it.
  dry=$scratch/summary && mkdir "$dry"
  python3 "$AMP_ROOT/scripts/gpu_summary.py" "$dry" >/dev/null
  [ -f "$dry/summary.txt" ] && grep -q "gpu-check: FAILED" "$dry/summary.txt" ||
    { echo "gpu-check: the summary did not report an empty run as failed" >&2; exit 1; }
  echo "gpu-check --dry-run: ${#tests[@]} test binaries and ${#programs[@]} programs start with the carried" \
       "libraries; dry run $(( SECONDS - start )) s. On the GPU machine, within ${GPU_CHECK_SECONDS:-450} s:"
  echo "  tests:      ${tests[*]} (none may skip)"
  echo "  programs:   seed_linear fashion_mnist char_lm, each eager and --graph (bench/gpu-programs.sh)"
  echo "  row ops:    bench/row_ops.cpp: LayerNorm and the fused classifier row against a device copy (GB/s)"
  echo "  FP8:        bench/fp8_gpt.sh: char_lm at width 768, 12 blocks, O2-fp8 against O2-bf16"
  echo "  GPT-2:      bench/gpt2_small.sh: 124M at O2-bf16, context 1024, batch 8: tokens/s, MFU"
  echo "  PyTorch:    bench/gpu-pytorch.sh: fp32, fp16 autocast + GradScaler, bf16 autocast"
  echo "  sanitizer:  compute-sanitizer memcheck on amp_cuda_backend_tests and the O2 capture cases"
  exit 0
fi

# --- on the GPU machine -------------------------------------------------------------
[ -d "$carry/bin" ] || { echo "gpu-check: no $carry: run 'scripts/gpu-check.sh prepare' first and carry it" >&2; exit 1; }
out=${OUT:-$AMP_ROOT/out/gpu-check}
work=$(mktemp -d)  # logs and JSON; $OUT gets the summary, results.json and one archive
mkdir -p "$out" && : >"$work/stages.txt"
deadline=$(( SECONDS + ${GPU_CHECK_SECONDS:-450} ))
finish() {
  python3 "$AMP_ROOT/scripts/gpu_summary.py" "$work" >/dev/null 2>"$work/summary.err"
  cp "$work/summary.txt" "$work/results.json" "$out/" 2>/dev/null
  tar -czf "$out/logs.tar.gz" -C "$work" . 2>/dev/null
  cat "$out/summary.txt" 2>/dev/null || { echo "gpu-check: no summary"; cat "$work/summary.err"; }
}
trap finish EXIT

# stage NAME SECONDS COMMAND...: at most SECONDS, and never past the deadline
# (30 s are kept for the summary); logs to NAME.log.
stage() {
  local name=$1 limit=$2
  shift 2
  local left=$(( deadline - SECONDS - 30 ))
  (( limit > left )) && limit=$left
  if (( limit < 5 )); then
    echo "$name: not run (no time left)" | tee -a "$work/stages.txt"
    return 1
  fi
  local start=$SECONDS
  timeout --kill-after=5 "$limit" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $(( SECONDS - start )) s" | tee -a "$work/stages.txt"
  (( rc == 124 || rc == 137 )) && echo "$name: TIMED OUT after $limit s" | tee -a "$work/stages.txt"
  return $rc
}

export AMP_CARRY="$carry" AMP_WORK="$work"
start=$SECONDS
unpack >"$work/unpack.log" 2>&1
echo "unpack: exit $? in $(( SECONDS - start )) s" | tee -a "$work/stages.txt"
export LD_LIBRARY_PATH="$(library_path):${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader >"$work/gpu.txt" 2>"$work/nvidia-smi.err"
# The stages in the order of their worth: a run short of time loses the last.
for t in "${tests[@]}"; do
  stage "test-$t" 120 "$carry/bin/$t"
done
stage programs 200 bash "$AMP_ROOT/bench/gpu-programs.sh"
# O2-fp8 against O2-bf16 at GPT-2 small's width and depth (char_lm's vocabulary), one round.
stage fp8-gpt 90 env CHAR_LM="$carry/bin/char_lm" AMP_DATA="$carry/data/fortunes" BENCH_OUT="$work" \
  bash "$AMP_ROOT/bench/fp8_gpt.sh" 1 --device cuda --width 768 --layers 12 --heads 12 --context 256 --steps 30
# GPT-2 small (124M) at O2-bf16, context 1024, batch 8: tokens/s and MFU against the bf16 dense peak of H100/H200.
stage gpt2-small 90 env CHAR_LM="$carry/bin/char_lm" AMP_DATA="$carry/data/fortunes" BENCH_OUT="$work" \
  GPT2_BUILD_LEVELS="" bash "$AMP_ROOT/bench/gpt2_small.sh" 20 O2-bf16 8 --peak 989 --device cuda
stage pytorch 120 bash "$AMP_ROOT/bench/gpu-pytorch.sh"
# LayerNorm at width 768 over 16384 rows and the 50257-wide classifier row, against a device copy.
stage row-ops 30 "$carry/bin/row_ops" --device cuda --json "$work/row_ops.json"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$sanitizer" ]; then
  stage sanitizer-backend 60 "$sanitizer" --tool memcheck --error-exitcode 9 "$carry/bin/amp_cuda_backend_tests"
  stage sanitizer-capture 90 "$sanitizer" --tool memcheck --error-exitcode 9 "$carry/bin/amp_cuda_capture_tests" \
    --test-case='*O2Policy>*'
else
  echo "sanitizer: compute-sanitizer not found (skipped)" | tee -a "$work/stages.txt"
fi
