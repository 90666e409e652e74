#!/usr/bin/env bash
# Creates .venv (if missing) and installs precision_nb into it.
#   bash scripts/setup.sh          the package and JupyterLab (the `notebook` extra)
#   bash scripts/setup.sh test     ... plus the test tools (pytest, nbval, playwright, ruff,
#                                  transformers), torchao (the `blocks` extra: numerics' block-scaled
#                                  formats) and torchvision, without its dependencies
#   bash scripts/setup.sh dev      ... plus the benchmark tools (accelerate)
# torch is installed first, on its own (scripts/torch_source.py says from where and why): the CPU
# build on Linux without an NVIDIA driver, pip's default (the CUDA build on Linux) with one.
#   PRECISION_NB_TORCH        the torch requirement (default "torch==2.13.0")
#   PRECISION_NB_TORCH_INDEX  auto (default) | cpu | default (pip's own configuration) | an index URL
#   PRECISION_NB_TORCHVISION  the torchvision requirement of test/dev (default "torchvision==0.28.0",
#                             the release paired with torch 2.13)
#   PRECISION_NB_DRY_RUN=1    print the commands instead of running them
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
extra="${1:-}"
case "$extra" in
  "") spec=".[notebook]" ;;
  test) spec=".[test]" ;;
  dev) spec=".[dev]" ;;
  *) echo "scripts/setup.sh: unknown extra '$extra' (allowed: test, dev, or nothing)" >&2; exit 2 ;;
esac
torch="${PRECISION_NB_TORCH:-torch==2.13.0}"
torchvision="${PRECISION_NB_TORCHVISION:-torchvision==0.28.0}"
dry="${PRECISION_NB_DRY_RUN:-}"

run() {
  if [ -n "$dry" ]; then
    printf "+"; printf " %q" "$@"; echo
  else
    "$@"
  fi
}

if [ ! -x .venv/bin/python ]; then
  run python3 -m venv .venv
fi
py=.venv/bin/python
# a dry run before .venv exists asks the system Python where torch would come from
probe="$py"
[ -x "$probe" ] || probe=python3
source_args="$("$probe" scripts/torch_source.py "$torch")"
torch_args=()
if [ -n "$source_args" ]; then
  while IFS= read -r line; do torch_args+=("$line"); done <<<"$source_args"
fi
pip=("$py" -m pip install -q --disable-pip-version-check)
if ! run "${pip[@]}" ${torch_args[@]+"${torch_args[@]}"} "$torch"; then
  echo "scripts/setup.sh: installing $torch failed; PRECISION_NB_TORCH_INDEX=default uses pip's" \
    "own configuration, PRECISION_NB_TORCH_INDEX=<index URL> another index" >&2
  exit 1
fi
torch_version() { "$py" -c "import torch; print(torch.__version__)" 2>/dev/null; }
installed=""
[ -n "$dry" ] || installed="$(torch_version)"
run "${pip[@]}" -e "$spec"
if [ -n "$extra" ]; then
  # --no-deps: torchvision requires torch, and pip could answer that with another build (PyPI's
  # CUDA wheel) in place of the one installed above. Its C ops do not load beside a CPU torch;
  # tests/models/conftest.py defines the two its import needs.
  run "${pip[@]}" --no-deps "$torchvision"
fi
if [ -z "$dry" ] && [ "$(torch_version)" != "$installed" ]; then
  echo "scripts/setup.sh: installing $spec replaced torch $installed with $(torch_version);" \
    "reinstall it (PRECISION_NB_TORCH) and find which requirement asked for another torch" >&2
  exit 1
fi
run "$py" -c "import torch, precision_nb; print(f'precision_nb {precision_nb.__version__} with torch {torch.__version__} in .venv')"
