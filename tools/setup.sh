#!/usr/bin/env bash
# Install kstrata and everything it needs into a virtual environment (default: .venv).
#   tools/setup.sh [VENV]
# - Python packages: torch first (the CPU build 2.13.0 where no torch is installed: a bare `torch`
#   requirement would pull a multi-GB CUDA build), then kstrata in editable mode with its dev extras.
# - Debian's llvm-22 and lld-22 (AMDGCN reassembly) when llvm-mc-22/ld.lld-22 are missing and apt-get
#   can be used; otherwise a warning says what is missing (kstrata doctor says what that disables).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${1:-.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch==2.13.0 (CPU)"
  "${pip[@]}" install "torch==2.13.0"
fi
echo "setup: installing kstrata (editable) with dev extras"
"${pip[@]}" install -e ".[dev]"

if ! command -v llvm-mc-22 >/dev/null || ! command -v ld.lld-22 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing llvm-22 lld-22 (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q llvm-22 lld-22 >/dev/null
  else
    echo "setup: warning: llvm-mc-22/ld.lld-22 not found and apt-get cannot be used here;" \
         "AMDGCN reassembly needs them (apt-get install -y llvm-22 lld-22)" >&2
  fi
fi
touch "$venv/.kstrata-installed"
echo "setup: done ($venv)"
