#!/usr/bin/env bash
# Creates .venv (if missing) and installs precision_nb into it.
#   bash scripts/setup.sh          the package and its notebook dependencies
#   bash scripts/setup.sh test     ... plus the test tools (pytest, nbval, playwright, ruff)
#   bash scripts/setup.sh dev      ... plus the benchmark tools (accelerate)
# torch is installed first, on its own, so that the CPU build is used where no GPU build is wanted:
# set PRECISION_NB_TORCH (default "torch==2.13.0") and PIP_INDEX_URL / PIP_EXTRA_INDEX_URL to change it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extra="${1:-}"
case "$extra" in
  "") spec="." ;;
  test) spec=".[test]" ;;
  dev) spec=".[dev]" ;;
  *) echo "scripts/setup.sh: unknown extra '$extra' (allowed: test, dev, or nothing)" >&2; exit 2 ;;
esac
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
py=.venv/bin/python
"$py" -m pip install -q --disable-pip-version-check "${PRECISION_NB_TORCH:-torch==2.13.0}"
"$py" -m pip install -q --disable-pip-version-check -e "$spec"
"$py" -c "import torch, precision_nb; print(f'precision_nb {precision_nb.__version__} with torch {torch.__version__} in .venv')"
