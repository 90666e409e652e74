"""Models nobody here wrote, called the way their users call them: Hugging Face GPT-2 and BERT
(``transformers``) and torchvision's resnet18, built from small configs with random weights
(nothing is downloaded: ``HF_HUB_OFFLINE=1``), beside an ``nn.TransformerEncoderLayer`` model.

torchvision's C ops that cannot load beside a CPU build of torch are defined in the suite's set-up
(``tests/thirdparty_setup.py``, imported by ``tests/conftest.py``), so torchvision and
``transformers`` import.
"""

from __future__ import annotations

import os

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"


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
