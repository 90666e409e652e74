"""The panel's copy-as-code area in each framework: the selector, the title and the code."""

from __future__ import annotations

import pytest

import precision_nb as pnb
from precision_nb.core.plan_code import FRAMEWORKS


@pytest.fixture
def panel():
    panel = pnb.Panel(mode="bf16", steps=5)
    yield panel
    panel.close()


def test_the_selector_lists_every_framework_and_starts_with_plain_pytorch(panel) -> None:
    selector = panel.widgets.code_framework
    assert [key for _, key in selector.options] == list(FRAMEWORKS)
    assert panel.code_framework == "pytorch" and "torch.autocast" in panel.code


@pytest.mark.parametrize(
    ("framework", "expected", "steps"),
    [("lightning", 'precision="bf16-mixed"', "max_steps=5"),
     ("accelerate", 'mixed_precision="bf16"', "steps, step = 5, 0"),
     ("transformers", "bf16=True", "max_steps=5")],
)  # fmt: skip
def test_choosing_a_framework_rewrites_the_code_and_its_title(
    panel, framework, expected, steps
) -> None:
    panel.widgets.code_framework.value = framework  # as a click in the dropdown does
    assert expected in panel.code and steps in panel.code  # the panel's steps control
    assert FRAMEWORKS[framework] in panel.widgets.code_title.value
    panel.set(mode="fp32")  # the code follows the plan in the chosen framework
    assert expected not in panel.code and "fp32 on cpu" in panel.code.splitlines()[0]
    assert panel.code == panel.explanation.code(framework, steps=5, seed=0)


def test_the_framework_can_be_set_in_code_and_a_bad_one_is_refused(panel) -> None:
    panel.set(code_framework="PL")
    assert panel.widgets.code_framework.value == "lightning"
    with pytest.raises(ValueError, match="framework: invalid value 'keras'"):
        panel.set(code_framework="keras")
    assert panel.code_framework == "lightning"
    assert "framework: invalid value 'keras'" in panel.error  # shown in the panel too
