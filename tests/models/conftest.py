"""Models nobody here wrote, called the way their users call them: Hugging Face GPT-2 and BERT
(``transformers``) and torchvision's resnet18, built from small configs with random weights
(nothing is downloaded: ``HF_HUB_OFFLINE=1``), beside an ``nn.TransformerEncoderLayer`` model.

torchvision's wheel beside a CPU build of torch cannot load its C ops (``_C.so``), and its import
then stops at ``register_fake("torchvision::nms")`` ("operator torchvision::nms does not exist"),
as does the import of ``transformers``, which imports torchvision when it is installed. Here, and
only when the library really cannot load, the two operators torchvision registers fake kernels for
are defined as schemas without kernels, so both import; the models used never call them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
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
    library = torch.library.Library("torchvision", "DEF")  # kept alive in _LIBRARY
    for schema in TORCHVISION_OPS_WITHOUT_KERNELS:
        library.define(schema)
    return library


_LIBRARY = _torchvision_library()


@pytest.fixture(scope="session")
def transformers():
    module = pytest.importorskip("transformers", reason="the test extra installs transformers")
    module.logging.set_verbosity_error()
    return module


@pytest.fixture(scope="session")
def torchvision():
    return pytest.importorskip(
        "torchvision", reason="scripts/setup.sh test installs torchvision==0.28.0 --no-deps"
    )
