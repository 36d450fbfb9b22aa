#!/usr/bin/env bash
# What a user's program costs to compile, and where amp's own build spends its time.
#
#   bash bench/compile_time.sh [OUT_DIR]      (default out/; ROUNDS=3 for the median and spread)
#
# 1. Three programs with one policy (O2-bf16) and one backend, compiled and linked
#    as a user would, one at a time: README's three-line program, a CNN
#    (bench/compile/cnn.cpp) and a GPT-2 (bench/compile/gpt2.cpp); with g++ -O2
#    (the CPU) and, where nvcc is, with nvcc -O2 for sm_90 (the GPU).
# 2. The slowest translation units of the last build in build/ (Ninja's log).
# Writes OUT_DIR/compile_time.csv and OUT_DIR/compile_time.png; prints both tables.
set -euo pipefail
source "$(dirname "$0")/../scripts/env.sh"
out=${1:-$AMP_ROOT/out}
rounds=${ROUNDS:-1}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 "$AMP_ROOT/tests/readme/snippets.py" "$work" "$AMP_ROOT" "$AMP_ROOT/README.md" >/dev/null
three_lines=$(ls "$work"/program_*.cpp | head -n 1)
frontend=$(ls -d "$AMP_ROOT"/.deps/cudnn-frontend-*/include 2>/dev/null | head -n 1 || true)
cxx=(g++ -std=c++20 -O2 -fopenmp -I"$AMP_ROOT/include" -isystem /usr/local/cuda/include)
cxx_libs=(-ldnnl -lz)
nvcc_cmd=(nvcc -std=c++20 -O2 -arch=sm_90 --expt-relaxed-constexpr -Xcompiler=-fopenmp -I"$AMP_ROOT/include")
nvcc_libs=(-lcublas -lcublasLt -lcudnn -ldnnl -lz)
[ -z "$frontend" ] || nvcc_cmd+=(-isystem "$frontend") nvcc_libs+=(-lnvrtc)

csv="$out/compile_time.csv"
echo "kind,name,compiler,round,seconds" >"$csv"
measure() {  # name compiler source
  local name=$1 compiler=$2 source=$3 round s
  for round in $(seq "$rounds"); do
    local start=$(date +%s.%N)
    if [ "$compiler" = g++ ]; then
      cp "$source" "$work/$name.cpp"
      "${cxx[@]}" "$work/$name.cpp" -o "$work/$name" "${cxx_libs[@]}"
    else
      cp "$source" "$work/$name.cu"
      "${nvcc_cmd[@]}" "$work/$name.cu" -o "$work/$name" "${nvcc_libs[@]}"
    fi
    s=$(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')")
    echo "program,$name,$compiler,$round,$s" >>"$csv"
    printf '  %-12s %-5s round %d: %6.1f s\n' "$name" "$compiler" "$round" "$s"
  done
}
echo "compile + link, one program at a time ($rounds round(s)):"
compilers=(g++)
command -v nvcc >/dev/null 2>&1 && compilers+=(nvcc)
for compiler in "${compilers[@]}"; do
  measure three_lines "$compiler" "$three_lines"
  measure cnn "$compiler" "$AMP_ROOT/bench/compile/cnn.cpp"
  measure gpt2 "$compiler" "$AMP_ROOT/bench/compile/gpt2.cpp"
done

log="$AMP_BUILD/.ninja_log"
if [ -f "$log" ]; then
  # The newest entry of each output; seconds of each translation unit (objects and precompiled headers).
  awk -F'\t' 'NR > 1 { t[$4] = ($2 - $1) / 1000 } END { for (o in t) if (o ~ /\.(o|gch)$/) printf "unit,%s,build,1,%.1f\n", o, t[o] }' \
    "$log" | sort -t, -k5 -g -r >>"$csv"
fi

# Debian's python3, for which setup.sh installed matplotlib.
/usr/bin/python3 "$AMP_ROOT/bench/compile_time_report.py" "$csv" "$out/compile_time.png"
