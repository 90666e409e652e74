"""`import precision_nb` stays light: no matplotlib, ipywidgets, pandas or jupyter."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("matplotlib", "ipywidgets", "pandas", "jupyter", "jupyterlab", "jupyter_client")

PROBE = """
import json, sys
import precision_nb
from precision_nb import PrecisionConfig, explain_precision, load_config
explain_precision(PrecisionConfig("bf16"), "cpu", capabilities="cuda-bf16")
load_config("precision:\\n  mode: bf16\\n")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in %r)))
"""


def test_import_and_core_use_load_no_ui_libraries():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE % (HEAVY,)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_plan_cli_module_imports_no_torch_at_import_time():
    code = "import sys, precision_nb.cli.plan; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
