"""The test extras' set-up, shared by the suite (``conftest.py``) and the benchmarks' processes.

torchvision's wheel beside a CPU build of torch cannot load its C ops (``_C.so``), and its import
then stops at ``register_fake("torchvision::nms")`` ("operator torchvision::nms does not exist"),
as does the import of ``transformers`` (and its ``Trainer``), which imports torchvision when it is
installed. Importing this module, and only when the library really cannot load, defines the two
operators torchvision registers fake kernels for as schemas without kernels, so both import;
nothing the tests or benchmarks run calls them. Nothing is downloaded from a model hub
(``HF_HUB_OFFLINE=1``).

A benchmark whose fresh measuring processes build a Hugging Face model puts
:func:`site_folder` on their ``PYTHONPATH``: its ``sitecustomize`` imports this module when each
process starts.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path

import torch

os.environ["HF_HUB_OFFLINE"] = "1"

TORCHVISION_OPS_WITHOUT_KERNELS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


def _torchvision_library() -> torch.library.Library | None:
    """Define torchvision's two faked operators when its C ops cannot load beside this torch."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("_C.*"))
    try:
        if found:
            torch.ops.load_library(str(found[0]))
            return None
    except OSError:
        pass
    library = torch.library.Library("torchvision", "DEF")  # kept alive in LIBRARY
    for schema in TORCHVISION_OPS_WITHOUT_KERNELS:
        library.define(schema)
    return library


LIBRARY = _torchvision_library()


def site_folder() -> str:
    """A new folder holding a ``sitecustomize.py`` that imports this module at start-up."""
    folder = tempfile.mkdtemp(prefix="precision_nb_site_")
    here = str(Path(__file__).resolve().parent)
    Path(folder, "sitecustomize.py").write_text(
        f"import sys\nsys.path.insert(0, {here!r})\nimport thirdparty_setup  # noqa: F401\n",
        encoding="utf-8",
    )
    return folder
