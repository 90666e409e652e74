#!/usr/bin/env bash
# Sets up .venv (the package and JupyterLab; see scripts/setup.sh) and runs the main job: profiles
# the built-in default workload under every precision plan this machine can run, writing
# metrics.csv, summary.csv, figures and report.html to profile-out/.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
exec .venv/bin/precision-nb profile --out "${1:-profile-out}"
