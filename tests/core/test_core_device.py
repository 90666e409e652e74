"""resolve_device: the auto order, explicit requests and their errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from precision_nb import get_capabilities, resolve_device


@pytest.mark.parametrize(
    "cuda,mps,expected", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")]
)
def test_auto_order_with_patched_torch(fake_torch, cuda, mps, expected):
    fake_torch(cuda=cuda, mps=mps)
    assert resolve_device() == torch.device(expected)
    assert resolve_device("auto") == torch.device(expected)


@pytest.mark.parametrize(
    "preset,expected", [("cuda-bf16", "cuda"), ("mps", "mps"), ("cpu-only", "cpu")]
)
def test_auto_order_with_presets(preset, expected):
    assert resolve_device("auto", capabilities=preset) == torch.device(expected)


def test_cuda_preferred_over_mps():
    both = dataclasses.replace(get_capabilities("cuda-bf16"), mps_available=True)
    assert resolve_device("auto", capabilities=both).type == "cuda"


@pytest.mark.parametrize("request_", ["cuda", "CUDA ", "cuda:0", torch.device("cuda")])
def test_explicit_cuda_without_cuda_raises(fake_torch, request_):
    fake_torch(cuda=False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        resolve_device(request_)


def test_explicit_mps_without_mps_raises(fake_torch):
    fake_torch(mps=False)
    with pytest.raises(RuntimeError, match="MPS is not available"):
        resolve_device("mps")


def test_cuda_index_beyond_device_count_raises():
    with pytest.raises(RuntimeError, match=r"'cuda:7'.*1 CUDA device"):
        resolve_device("cuda:7", capabilities="cuda-bf16")
    assert resolve_device("cuda:0", capabilities="cuda-bf16") == torch.device("cuda:0")


def test_explicit_available_devices_pass(fake_torch):
    fake_torch(cuda=True, mps=True)
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device(" MPS") == torch.device("mps")
    assert resolve_device("cpu") == torch.device("cpu")


def test_other_device_strings_go_to_torch_device():
    assert resolve_device("meta") == torch.device("meta")
    assert resolve_device(None) == resolve_device("auto")


@pytest.mark.parametrize("bad", [0, 1.0, ["cuda"], {"type": "cuda"}, True, torch.float16])
def test_wrong_device_object_types_raise_value_error(bad):
    with pytest.raises(ValueError, match=r"device: invalid value .* expected a string"):
        resolve_device(bad)


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "tpu:0", "half"])
def test_unparseable_device_strings_raise_value_error(bad):
    with pytest.raises(ValueError, match=rf"device: invalid value '{bad}'.*'auto', 'cpu', 'cuda'"):
        resolve_device(bad)


def test_bad_device_message_says_what_is_allowed_not_torchs_whole_list():
    with pytest.raises(ValueError) as err:
        resolve_device("gpu")
    message = str(err.value)
    assert "'cuda:N'" in message and "another torch device string" in message
    assert "mkldnn" not in message and "privateuseone" not in message


def test_device_types_known_without_torch_are_torchs_own():
    import re

    from precision_nb.core.names import TORCH_DEVICE_TYPES

    with pytest.raises(RuntimeError) as err:
        torch.device("notadevice")
    listed = re.search(r"Expected one of (.*) device type", str(err.value))
    assert listed is not None
    assert tuple(listed.group(1).split(", ")) == TORCH_DEVICE_TYPES


@pytest.mark.parametrize(
    "text,canonical", [(" CUDA:1 ", "cuda:1"), ("cpu:0", "cpu:0"), ("Auto", "auto"), ("xpu", "xpu")]
)
def test_device_strings_checked_without_torch_match_torch(text, canonical):
    from precision_nb.core.names import device_string

    assert device_string(text) == canonical
    if canonical != "auto":
        assert str(torch.device(canonical)) == canonical


@pytest.mark.parametrize("bad", ["cuda:-1", "cuda:01", "cuda: 1", "cuda:1:2", "", "c uda"])
def test_malformed_device_strings_are_refused_like_torch_refuses_them(bad):
    from precision_nb.core.names import device_string

    with pytest.raises(ValueError, match="allowed: 'auto', 'cpu'"):
        device_string(bad)
    with pytest.raises(RuntimeError):
        torch.device(bad.strip().lower())
