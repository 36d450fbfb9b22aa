#!/usr/bin/env bash
# The GPU check in one call. The binaries are built here, for sm_90, and
# carried; the GPU machine (CUDA toolkit and PyTorch, no Debian packages, no
# MPI, no network) only runs them:
#
#   scripts/gpu-check.sh prepare    here: build what the check runs (if not built),
#                                   and put into .gpu-carry/ (git-ignored) the
#                                   stripped binaries, every library they load that
#                                   the GPU machine may lack, Open MPI's plugins (the
#                                   parallel tests run as one rank), and the data;
#                                   check it fits the budget (48 MiB)
#   scripts/gpu-check.sh            there (the device tool: carry .gpu-carry, timeout_s
#                                   of at least GPU_CHECK_SECONDS + 30): the stages of
#                                   the plan below; one summary
#   scripts/gpu-check.sh --plan     the plan and its sum against the deadline; fails
#                                   when it does not fit (no build: tests/scripts uses it)
#   scripts/gpu-check.sh --dry-run  here and in CI: the plan, prepare, then start every
#                                   carried binary with the carried libraries only, run
#                                   the parallel tests as one rank (the system's Open MPI
#                                   hidden where a mount namespace is allowed), and the
#                                   summary's own test (tests/scripts/test_gpu_summary.py)
#
# One deadline (GPU_CHECK_SECONDS, default 450) bounds the run: each stage gets
# at most its limit and what is left of the deadline, less reserve_s for the last
# summary, so the call always ends in time. After every stage the summary so
# far and the logs are rewritten into $OUT (summary.txt, results.json,
# logs.tar.gz): a call killed from outside still brings home what had ended.
# GPU_CHECK_BUILD=no carries what $AMP_BUILD holds without configuring or
# building (to check this script while the build is out of date).
set -uo pipefail
source "$(dirname "$0")/env.sh"
carry="$AMP_ROOT/.gpu-carry"
budget_mib=48
mode=${1:-run}
deadline_s=${GPU_CHECK_SECONDS:-450}
reserve_s=10  # the last summary and the archive, and timeout's grace after each stage's limit

# --- the plan: the one table both the dry run and the run read -----------------------
# name, limit (s), essential|optional, command (bash; BIN, DATA, WORK, ROOT are set).
# Essential stages first: they are what the check is for. An optional stage cut for
# time, refused by the machine (exit 77) or never reached is a warning in the summary;
# an essential one that does not pass is a failure. The limits are about twice what the
# stage should need on an H100 (none has been timed there yet: docs/gpu-check.md).
# memcheck runs on a few named cases, not whole binaries (a cuDNN/cuBLAS binary under
# it runs for minutes); doctest splits --test-case at commas, so a name's comma is '*'.
plan_table() {
  cat <<'PLAN'
setup                        10 essential bash "$ROOT/scripts/gpu-check.sh" setup
test-amp_cuda_backend_tests  60 essential "$BIN/amp_cuda_backend_tests"
test-amp_cuda_training_tests 80 essential "$BIN/amp_cuda_training_tests"
test-amp_cuda_capture_tests  40 essential "$BIN/amp_cuda_capture_tests"
test-amp_cuda_parallel_tests 15 essential "$BIN/amp_cuda_parallel_tests"
programs                    100 essential bash "$ROOT/bench/gpu-programs.sh"
row-ops                      15 essential "$BIN/row_ops" --device cuda --json "$WORK/row_ops.json"
pytorch                      30 optional  bash "$ROOT/bench/gpu-pytorch.sh"
fp8-gpt                      25 optional  env CHAR_LM="$BIN/char_lm" AMP_DATA="$DATA/fortunes" BENCH_OUT="$WORK" bash "$ROOT/bench/fp8_gpt.sh" 1 --device cuda --width 768 --layers 12 --heads 12 --context 256 --steps 30
gpt2-small                   25 optional  env CHAR_LM="$BIN/char_lm" AMP_DATA="$DATA/fortunes" BENCH_OUT="$WORK" GPT2_BUILD_LEVELS="" bash "$ROOT/bench/gpt2_small.sh" 20 O2-bf16 8 --peak 989 --device cuda
sanitizer-backend            15 optional  bash "$ROOT/scripts/gpu-check.sh" memcheck "$BIN/amp_cuda_backend_tests" --test-case="cuda: casts give the same bits on device and host,cuda: for_each and transform_reduce match the host twins,*gemm matches the FP64 reference*<__half*float>>"
sanitizer-capture            15 optional  bash "$ROOT/scripts/gpu-check.sh" memcheck "$BIN/amp_cuda_capture_tests" --test-case="*a replayed step trains as the host*<amp::O2Policy>,*steady state*<amp::O2BF16Policy>"
PLAN
}
# What prepare builds and carries: every binary the plan and bench/gpu-programs.sh start.
tests=(amp_cuda_backend_tests amp_cuda_training_tests amp_cuda_capture_tests amp_cuda_parallel_tests)
programs=(seed_linear fashion_mnist char_lm row_ops)

# Prints "gpu-check plan: S s of D s" and the table; fails when the limits and the
# reserve do not fit the deadline, the deadline is over 450 s (the call's own limit
# less start-up), or an essential stage comes after an optional one.
check_plan() {
  local name limit kind cmd sum=0 essential=0 late="" bad=0
  while read -r name limit kind cmd; do
    (( sum += limit ))
    case $kind in
      essential) (( essential += limit )); [ -z "$late" ] || { echo "gpu-check: essential $name after optional $late" >&2; bad=1; } ;;
      optional) late=${late:-$name} ;;
      *) echo "gpu-check: stage $name is '$kind', neither essential nor optional" >&2; bad=1 ;;
    esac
  done < <(plan_table)
  echo "gpu-check plan: $sum s of $deadline_s s (essential $essential s first; $reserve_s s kept for the summary)"
  plan_table | awk '{printf "  %-30s %4s s  %-9s\n", $1, $2, $3}'
  if (( sum + reserve_s > deadline_s || deadline_s > 450 )); then
    echo "gpu-check: the plan ($sum s + $reserve_s s) does not fit the deadline of $deadline_s s (at most 450)" >&2
    bad=1
  fi
  return $bad
}

# --- here: the carry ------------------------------------------------------------
# Libraries the GPU machine has: the C/C++ runtime and the CUDA toolkit's big
# ones (cuBLAS, NCCL, cuDNN, NVRTC: hundreds of MiB; there PyTorch's nvidia wheels hold
# them); everything else a binary loads is carried.
system_lib='^(linux-vdso|ld-linux(-x86-64)?|libc|libm|libstdc\+\+|libgcc_s|libdl|libpthread|librt)\.so'
toolkit_lib='^(libcublas|libcublasLt|libnccl|libcudnn|libnvrtc)\.so'

# Open MPI opens its components (MCA plugins) with dlopen from its install tree, so
# ldd does not list them. Carried: each plugin whose libraries are all the system's,
# ones the binaries load anyway (libmpi, libopen-pal, hwloc, libevent...) or Open MPI's
# own libmca_common_*: none needing UCX, libfabric, verbs, PMIx or OpenSHMEM, which a
# single rank does not use. Prints the plugins' paths.
mpi_plugins() {
  local core=$1 dir p extra
  dir=$(ompi_info --parsable --path pkglibdir 2>/dev/null | cut -d: -f3)
  [ -d "$dir" ] || { echo "gpu-check: no Open MPI plugin folder (ompi_info --path pkglibdir)" >&2; return 1; }
  for p in "$dir"/mca_*.so; do
    extra=$(ldd "$p" | awk '$2 == "=>" {print $1}' | grep -vE "$system_lib|^libmca_common_" | grep -vxF -f <(echo "$core"))
    [ -z "$extra" ] && echo "$p"
  done
}

prepare() {
  local start=$SECONDS
  if [ "${GPU_CHECK_BUILD:-yes}" != no ]; then
    if [ ! -f "$AMP_BUILD/CMakeCache.txt" ]; then
      "$AMP_ROOT/scripts/setup.sh" >/dev/null || return 1
    fi
    amp_configure -DAMP_EXAMPLES_CUDA=ON || return 1  # the programs' GPU halves (the demo leaves them out without a GPU)
    cmake --build "$AMP_BUILD" -j "$AMP_JOBS" --target "${tests[@]}" "${programs[@]}" >/dev/null ||
      { echo "gpu-check: building the carried targets failed" >&2; return 1; }
  fi
  grep -q '^CMAKE_CUDA_ARCHITECTURES:STRING=.*90' "$AMP_BUILD/CMakeCache.txt" ||
    { echo "gpu-check: $AMP_BUILD is not built for sm_90 (CMAKE_CUDA_ARCHITECTURES)" >&2; return 1; }
  rm -rf "$carry" && mkdir -p "$carry/bin" "$carry/lib" "$carry/data/fortunes" "$carry/mpi/plugins" "$carry/mpi/share/openmpi"
  local binaries=() b p missing=()
  for b in "${tests[@]/#/$AMP_BUILD/tests/}" "${programs[@]/#/$AMP_BUILD/examples/}" "${programs[@]/#/$AMP_BUILD/bench/}"; do
    [ -f "$b" ] && binaries+=("$b")
  done
  for p in "${tests[@]}" "${programs[@]}"; do
    [[ " ${binaries[*]##*/} " == *" $p "* ]] || missing+=("$p")
  done
  if (( ${#missing[@]} )); then
    echo "gpu-check: not built in $AMP_BUILD: ${missing[*]}" >&2
    [ "${GPU_CHECK_BUILD:-yes}" = no ] || return 1
    echo "gpu-check: GPU_CHECK_BUILD=no: left out of the carry (this carry cannot run the whole plan)" >&2
  fi
  local libs plugins=()
  libs=$(for b in "${binaries[@]}"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
  if grep -q '^libmpi\.so' <<<"$libs"; then
    mapfile -t plugins < <(mpi_plugins "$(cut -d' ' -f1 <<<"$libs")")
    (( ${#plugins[@]} )) || { echo "gpu-check: no Open MPI plugin to carry" >&2; return 1; }
    libs=$( (echo "$libs"; for p in "${plugins[@]}"; do ldd "$p"; done | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}') | sort -u)
    cp "${plugins[@]}" "$carry/mpi/plugins/"
    # Its help texts: an MPI error then says what went wrong, not that a help file is missing.
    cp "$(ompi_info --parsable --path pkgdatadir | cut -d: -f3)"/help-*.txt "$carry/mpi/share/openmpi/"
  fi
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
  # Open MPI's plugins and help texts: many small files, one archive.
  [ -z "$(ls -A "$carry/mpi/plugins")" ] || tar -cJf "$carry/mpi.tar.xz" -C "$carry" mpi
  rm -rf "$carry/mpi"
  local kib
  kib=$(du -sk "$carry" | cut -f1)
  echo "gpu-check: carry $(( kib / 1024 )).$(( kib % 1024 * 10 / 1024 )) MiB of $budget_mib MiB" \
       "(${#plugins[@]} Open MPI plugins), made in $(( SECONDS - start )) s:"
  du -sh "$carry"/* | sed 's/^/  /'
  if (( kib > budget_mib * 1024 )); then
    echo "gpu-check: the carry is over its budget of $budget_mib MiB" >&2
    return 1
  fi
}

# --- both: unpacking, the library path, one-rank MPI ----------------------------------
unpack() {
  python3 - "$carry" <<'PY' || return 1
import lzma, os, shutil, sys, tarfile
archive = os.path.join(sys.argv[1], "mpi.tar.xz")
if os.path.exists(archive):
    with tarfile.open(archive) as tar:
        tar.extractall(sys.argv[1], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    os.remove(archive)
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

# Open MPI as one rank, with no mpirun and no install: MPI_Init in a process that
# mpirun did not start is a "singleton". By default it would fork an orted daemon
# from the install's bindir; isolated, it starts none (it will never spawn). The
# plugins come from the carry; only the self transport (one rank talks to itself);
# no parameter files of the host (this machine's /etc/openmpi would differ from there).
mpi_env() {
  export OPAL_PREFIX="$carry/mpi"  # help texts: $OPAL_PREFIX/share/openmpi
  export OMPI_MCA_mca_base_component_path="$carry/mpi/plugins"
  export OMPI_MCA_mca_base_param_files=/dev/null
  export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self
  export OMPI_MCA_btl_base_warn_component_unused=0 OMPI_MCA_hwloc_base_binding_policy=none
  # hwloc's own plugins (GL, OpenCL, PCI, libxml2) would load X11 and ICU from the
  # system: none is needed to see one machine's cores, and the GPU machine has none.
  export HWLOC_PLUGINS_PATH="$carry/mpi/no-hwloc-plugins"
  # NCCL's bootstrap over loopback: one rank needs no other interface, and what a
  # machine with no network has is not known here. Its warnings go to the stage's log.
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo} NCCL_DEBUG=${NCCL_DEBUG:-WARN}
}

# --- stages' helpers (run as 'gpu-check.sh NAME' by the plan's commands) -------------
if [ "$mode" = setup ]; then
  unpack || exit 1
  # The machine as found: nvidia-smi's line and the kernel (4.4.0 is gVisor, where
  # compute-sanitizer and ncu refuse the device: KINDS.md).
  timeout 20 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader \
    >"$AMP_WORK/gpu.txt" 2>"$AMP_WORK/nvidia-smi.err"
  echo "kernel $(uname -r)" >"$AMP_WORK/machine.txt"
  cat "$AMP_WORK/gpu.txt" "$AMP_WORK/machine.txt"
  exit 0
fi
if [ "$mode" = memcheck ]; then  # memcheck BINARY ARGS...: exit 77 where the machine refuses it
  shift
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  [ -n "$sanitizer" ] || { echo "refused: compute-sanitizer not found"; exit 77; }
  log=$(mktemp)
  "$sanitizer" --tool memcheck --error-exitcode 9 "$@" >"$log" 2>&1
  rc=$?
  cat "$log"
  grep -q "Device not supported" "$log" && { echo "refused: the device is not supported (gVisor?)"; rc=77; }
  rm -f "$log"
  exit $rc
fi

if [ "$mode" = --plan ]; then
  check_plan
  exit $?
fi
if [ "$mode" = prepare ]; then
  prepare
  exit $?
fi

# --- here and in CI: the dry run ------------------------------------------------------
if [ "$mode" = --dry-run ]; then
  start=$SECONDS
  check_plan || exit 1
  prepare || exit 1
  # Every CUDA test binary the build defines (CMake's list of target folders; running
  # nothing) must be in the plan.
  for t in $(grep -oE '/amp_cuda_[a-z0-9_]+_tests\.dir$' "$AMP_BUILD/CMakeFiles/TargetDirectories.txt" 2>/dev/null |
             sed 's|^/||; s|\.dir$||'); do
    [[ " ${tests[*]} " == *" $t "* ]] && plan_table | grep -q "^test-$t " ||
      { echo "gpu-check: the build defines $t, which the plan does not run (tests, plan_table)" >&2; exit 1; }
  done
  for t in $(plan_table | grep -oE '\$BIN/[A-Za-z0-9_]+' | cut -d/ -f2 | sort -u); do
    [[ " ${tests[*]} ${programs[*]} " == *" $t "* ]] || { echo "gpu-check: the plan runs $t, which is not carried" >&2; exit 1; }
  done
  # Unpacked in a copy: .gpu-carry stays packed, ready to carry.
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' EXIT
  cp -r "$carry" "$scratch/carry" && carry=$scratch/carry
  unpack || exit 1
  export LD_LIBRARY_PATH="$carry/lib"  # and nothing else: what is not carried must be the system's or the toolkit's
  mpi_env
  failed=0
  # outside FILE...: the libraries ldd resolves outside the carry, the system and the toolkit.
  outside() {
    ldd "$@" | awk '$2 == "=>" {print $1, $3}' | sort -u | while read -r lib path; do
      [[ "$path" == "$carry/"* || "$lib" =~ $system_lib || "$lib" =~ $toolkit_lib ]] || echo "$lib ($path)"
    done
  }
  for b in "$carry"/bin/*; do
    name=$(basename "$b")
    away=$(outside "$b")
    [ -z "$away" ] || { echo "gpu-check: $name loads libraries that are not carried: $away" >&2; failed=1; }
    if [[ "$name" == amp_*_tests ]]; then args=(--list-test-cases); else args=(--help); fi
    if ! "$b" "${args[@]}" >/dev/null 2>"$scratch/start.err"; then
      echo "gpu-check: $name does not start with the carried libraries: $(tail -3 "$scratch/start.err")" >&2
      failed=1
    fi
  done
  away=$(outside "$carry"/mpi/plugins/*.so)
  [ -z "$away" ] || { echo "gpu-check: Open MPI's plugins load libraries that are not carried: $away" >&2; failed=1; }
  # The parallel tests as one rank, all the way through MPI_Init, an all-gather and
  # MPI_Finalize (each case skips here without a GPU). The loader's log (LD_DEBUG)
  # names every library the process initialised, the plugins too: all must be carried,
  # the system's or the toolkit's. Where a mount namespace is allowed, the system's
  # Open MPI (its libraries, plugins, help, configuration, orted) is hidden as well.
  hide='for d in /usr/lib/x86_64-linux-gnu/{openmpi,hwloc} /usr/share/openmpi /etc/openmpi; do
          [ -d "$d" ] && mount -t tmpfs none "$d"; done
        for f in /usr/lib/x86_64-linux-gnu/lib{mpi,open-rte,open-pal,oshmem}.so* /usr/bin/orted /usr/bin/mpirun; do
          [ -e "$f" ] && mount --bind /dev/null "$f"; done
        exec "$@"'
  # LD_DEBUG for the test binary alone (env execs it: one process, one log).
  rank=(env LD_DEBUG=libs LD_DEBUG_OUTPUT="$scratch/ld" "$carry/bin/amp_cuda_parallel_tests")
  where="the system's Open MPI present (no mount namespace here)"
  if unshare -m --propagation private true 2>/dev/null; then
    rank=(unshare -m --propagation private bash -c "$hide" hide "${rank[@]}")
    where="the system's Open MPI hidden"
  fi
  timeout 60 "${rank[@]}" >"$scratch/rank.log" 2>&1
  rc=$?
  loaded=$(cat "$scratch"/ld.* 2>/dev/null | sed -n 's/.*calling init: //p' | sort -u)
  away=$(while read -r path; do
           lib=$(basename "$path")
           [[ "$path" == "$carry/"* || "$lib" =~ $system_lib || "$lib" =~ $toolkit_lib || "$lib" == libcuda.so* ]] || echo "$path"
         done <<<"$loaded")
  if (( rc != 0 )) || ! grep -q "Status: SUCCESS" "$scratch/rank.log" || [ -n "$away" ]; then
    echo "gpu-check: amp_cuda_parallel_tests as one rank ($where): exit $rc; outside the carry: ${away:-none}" >&2
    tail -15 "$scratch/rank.log" >&2
    failed=1
  else
    echo "gpu-check: amp_cuda_parallel_tests ran as one rank with the carried Open MPI ($where):" \
         "$(grep -c 'mca_' <<<"$loaded") plugins and $(grep -c "^$carry/lib" <<<"$loaded") carried libraries loaded"
  fi
  (( failed )) && exit 1
  # The summary's judgement on made-up work folders: a cut optional stage warns, a cut
  # essential one fails, the versions line is read, an old cuDNN is named as the cause.
  python3 "$AMP_ROOT/tests/scripts/test_gpu_summary.py" || exit 1
  echo "gpu-check --dry-run: $(ls "$carry/bin" | wc -l) binaries start with the carried libraries;" \
       "dry run $(( SECONDS - start )) s"
  exit 0
fi

# --- on the GPU machine -------------------------------------------------------------
[ "$mode" = run ] || { echo "usage: scripts/gpu-check.sh [prepare|--plan|--dry-run]" >&2; exit 2; }
[ -d "$carry/bin" ] || { echo "gpu-check: no $carry: run 'scripts/gpu-check.sh prepare' first and carry it" >&2; exit 1; }
check_plan >/dev/null || echo "gpu-check: the plan does not fit $deadline_s s: the last stages will be cut"
out=${OUT:-$AMP_ROOT/out/gpu-check}
work=$(mktemp -d)  # logs and JSON; $OUT gets the summary, results.json and one archive
mkdir -p "$out" && : >"$work/stages.txt"
plan_table >"$work/plan.txt"
deadline=$(( SECONDS + deadline_s ))

# The summary so far into $OUT, each file written beside and renamed (a call killed
# mid-write keeps the previous whole one). A runaway log keeps its last 8 MiB: the
# device tool brings back files of at most 16 MiB.
publish() {
  python3 "$AMP_ROOT/scripts/gpu_summary.py" "$work" >/dev/null 2>"$work/summary.err"
  find "$work" -name '*.log' -size +8M -exec sh -c 'tail -c 8M "$1" >"$1.cut" && mv "$1.cut" "$1"' _ {} \;
  local f
  for f in summary.txt results.json; do
    [ -f "$work/$f" ] && cp "$work/$f" "$out/.$f" && mv -f "$out/.$f" "$out/$f"
  done
  tar -czf "$out/.logs.tar.gz" -C "$work" . 2>/dev/null && mv -f "$out/.logs.tar.gz" "$out/logs.tar.gz"
}
running=""
finish() {
  [ -n "$running" ] && kill -TERM "$running" 2>/dev/null
  trap - EXIT
  publish
  cat "$out/summary.txt" 2>/dev/null || { echo "gpu-check: no summary"; cat "$work/summary.err"; }
}
trap finish EXIT
trap 'exit 143' TERM INT  # the stage runs in the background, so the trap fires at once

# stage NAME LIMIT KIND COMMAND: at most LIMIT seconds, never past the deadline; its
# output to NAME.log; its outcome to stages.txt in the form gpu_summary.py reads.
stage() {
  local name=$1 limit=$2 kind=$3 cmd=$4
  local left=$(( deadline - SECONDS - reserve_s )) given=$limit
  (( given > left )) && given=$left
  if (( given < 3 )); then
    echo "$name: not run (no time left) (limit $limit s, $kind)" | tee -a "$work/stages.txt"
  else
    local start=$SECONDS
    timeout --kill-after=3 "$given" bash -c "$cmd" >"$work/$name.log" 2>&1 &
    running=$!
    wait "$running"
    local rc=$?
    running=""
    echo "$name: exit $rc in $(( SECONDS - start )) s (limit $given s, $kind)" | tee -a "$work/stages.txt"
  fi
  publish
}

export AMP_CARRY="$carry" AMP_WORK="$work" BIN="$carry/bin" DATA="$carry/data" WORK="$work" ROOT="$AMP_ROOT"
libraries=$(library_path)
export LD_LIBRARY_PATH="$libraries:${LD_LIBRARY_PATH:-}"
mpi_env
while read -r name limit kind cmd; do
  stage "$name" "$limit" "$kind" "$cmd"
done < <(plan_table)
python3 "$AMP_ROOT/scripts/gpu_summary.py" "$work" >/dev/null 2>&1
status=$?
finish
exit $status
