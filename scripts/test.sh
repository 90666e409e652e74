#!/usr/bin/env bash
# Sets up .venv with the test tools and runs every check: ruff, the unit and CLI tests, the panel's
# headless and browser tests, and the notebooks under nbval. Extra arguments go to pytest.
# It ends with what was skipped, if anything (e.g. the browser test without Chromium), and the
# command that enables it (scripts/skipped_summary.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh test
. .venv/bin/activate
ruff check .
ruff format --check .
report="$(mktemp -t precision-nb-junit.XXXXXX)"
trap 'rm -f "$report"' EXIT
set +e
python -m pytest tests notebooks --nbval-lax --nbval-current-env \
  --nbval-sanitize-with notebooks/sanitize.cfg -p no:cacheprovider --junitxml="$report" "$@"
rc=$?
set -e
python scripts/skipped_summary.py "$report"
if [ "$rc" -eq 5 ]; then
  echo "scripts/test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$rc"
