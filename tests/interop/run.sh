#!/usr/bin/env bash
# Runs a Python check in a virtual environment that sees Debian's python3-torch and adds PyPI packages: VENV is
# made once and reused (one per check, so that ctest may run them side by side).
# usage: run.sh VENV "PACKAGES" SCRIPT ARGS...
set -euo pipefail
venv=$1 packages=$2 script=$3
shift 3
py=/usr/bin/python3
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "[amp-skip] PyTorch interchange: Debian's python3-torch is not installed (scripts/test.sh installs it)"
  exit 0
fi
stamp="$venv/.packages"
if [ "$(cat "$stamp" 2>/dev/null)" != "$packages" ]; then
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
  # shellcheck disable=SC2086  # the packages are words
  if ! "$venv/bin/pip" install -q --disable-pip-version-check $packages; then
    echo "[amp-skip] PyTorch interchange: cannot install $packages from PyPI"
    exit 0
  fi
  echo "$packages" > "$stamp"
fi
exec "$venv/bin/python" "$(dirname "$0")/$script" "$@"
