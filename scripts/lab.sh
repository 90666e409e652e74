#!/usr/bin/env bash
# Starts JupyterLab from .venv (installed by scripts/demo.sh) on the tutorial notebooks; extra
# arguments go to `jupyter lab` (then name the folder or notebook yourself). As root (e.g. in a
# container) it adds --allow-root, without which JupyterLab refuses to start.
#   PRECISION_NB_DRY_RUN=1   print the command instead of running it
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jupyter="$root/.venv/bin/jupyter"
if [ ! -x "$jupyter" ]; then
  echo "scripts/lab.sh: $jupyter not found; run bash scripts/demo.sh first (it installs JupyterLab)" >&2
  exit 2
fi
args=()
if [ "$(id -u)" -eq 0 ]; then
  args+=(--allow-root)
fi
if [ "$#" -eq 0 ]; then
  set -- "$root/notebooks"
fi
cmd=("$jupyter" lab ${args[@]+"${args[@]}"} "$@")
if [ -n "${PRECISION_NB_DRY_RUN:-}" ]; then
  printf "+"; printf " %q" "${cmd[@]}"; echo
  exit 0
fi
exec "${cmd[@]}"
