#!/usr/bin/env bash
# Runs check_pytorch.py in a virtual environment that sees Debian's python3-torch
# and adds the PyPI safetensors package: VENV is made once and reused.
set -euo pipefail
binary=$1 data=$2 venv=$3
py=/usr/bin/python3
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "[amp-skip] PyTorch interchange: Debian's python3-torch is not installed (scripts/test.sh installs it)"
  exit 0
fi
if ! "$venv/bin/python" -c "import safetensors" 2>/dev/null; then
  rm -rf "$venv"
  "$py" -m venv --system-site-packages "$venv"
  if ! "$venv/bin/pip" install -q --disable-pip-version-check safetensors; then
    echo "[amp-skip] PyTorch interchange: cannot install safetensors from PyPI"
    exit 0
  fi
fi
exec "$venv/bin/python" "$(dirname "$0")/check_pytorch.py" "$binary" "$data"
