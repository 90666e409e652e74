"""``precision-nb numerics``: block formats from the command line, its files, and clear errors."""

from __future__ import annotations

import sys
import textwrap

import pandas as pd
import pytest

from precision_nb.cli import numerics as cli
from precision_nb.cli.main import main

pytest.importorskip("torchao", reason="the test extra installs torchao (the blocks extra)")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "numericsmodel.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            def make():
                torch.manual_seed(0)
                return nn.Sequential(
                    nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 96), nn.GELU(), nn.Linear(96, 10)
                )

            class Scale(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.w = nn.Parameter(torch.ones(8))

                def forward(self, x):
                    return (x * self.w).sum()

            def no_gemm():
                return Scale()

            def batches():
                g = torch.Generator().manual_seed(0)
                x = torch.randn(32, 64, generator=g)
                return [(x, torch.randint(0, 10, (32,), generator=g))]

            def scale_batches():
                return [torch.randn(4, 8)]

            class Broken(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lin = nn.Linear(8, 8)

                def forward(self, x):
                    raise TypeError("the model's own bug")

            def broken():
                return Broken()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "numericsmodel"
    sys.modules.pop("numericsmodel", None)


def test_block_formats_of_a_user_model_print_and_write_their_tables(user_module, tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["numerics", "--model", f"{user_module}:make", "--batches", f"{user_module}:batches"]
    rc = main([*argv, "--formats", "mxfp8,nvfp4", "--hardware", "h100,b200", "--out", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "mxfp8_e4m3: median relative error" in printed and "nvfp4 keeps in bf16: 0 (" in printed
    assert "nvfp4 keeps in bf16: 0 (first GEMM layer); 4 (last GEMM layer" in printed
    assert "h100 mxfp8_e4m3: emulated" in printed
    assert "b200 nvfp4: native, datasheet 9000 TFLOP/s; estimated GEMM speedup" in printed
    gemms = pd.read_csv(out / "numerics_gemms.csv")
    shapes = [[0, 32, 64, 96], [2, 32, 96, 96], [4, 32, 96, 10]]
    assert gemms[["layer", "M", "K", "N"]].values.tolist() == shapes
    assert gemms["mx_qualifies"].tolist() == [True, True, False]  # 96 = 3 x 32; N = 10 is not
    blocks = pd.read_csv(out / "numerics_blocks.csv")
    assert set(blocks["format"]) == {"mxfp8_e4m3", "nvfp4"}
    hardware = pd.read_csv(out / "numerics_hardware.csv")
    assert set(hardware["hardware"]) == {"h100", "b200"}
    assert set(hardware["format"]) == {"fp8_e4m3", "mxfp8_e4m3", "nvfp4"}
    assert "Block-scaled formats" in (out / "numerics.html").read_text()


def test_a_model_without_gemm_layers_says_why(user_module, capsys):
    argv = ["numerics", "--model", f"{user_module}:no_gemm"]
    rc = main([*argv, "--batches", f"{user_module}:scale_batches", "--formats", "mxfp4"])
    assert rc == 0
    assert "Block formats: no linear or convolution layer" in capsys.readouterr().out


def test_a_models_own_error_is_one_line_with_its_type(user_module, capsys):
    argv = ["numerics", "--model", f"{user_module}:broken"]
    assert main([*argv, "--batches", f"{user_module}:scale_batches", "--formats", "mxfp4"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("precision-nb numerics: run failed: TypeError: the model's own bug")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--formats", "mxfp6"], "--formats: invalid value 'mxfp6'; allowed: fp16, bf16"),
        (["--formats", ""], "--formats: invalid value ''"),
        (["--hardware", "b100"], "--hardware: invalid value 'b100'; allowed: h100, h200"),
        (["--workload", "rnn"], "--workload: invalid value 'rnn'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(flags, message, capsys):
    assert main(["numerics", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("precision-nb numerics: error: ") and message in err


def test_torchao_missing_exits_2_naming_the_extra(monkeypatch, capsys):
    from precision_nb.engine.numerics import blocks

    monkeypatch.setattr(blocks, "_import", lambda: (None, "ModuleNotFoundError: torchao"))
    assert main(["numerics", "--workload", "mlp", "--preset", "tiny", "--formats", "mxfp4"]) == 2
    err = capsys.readouterr().err
    assert "install the optional extra 'blocks'" in err and "precision-nb[blocks]" in err


def test_the_flag_names_are_the_engines():
    from precision_nb.engine.numerics.blocks import BLOCK_ALIASES, BLOCK_FORMATS, resolve_formats
    from precision_nb.engine.numerics.formats import FORMATS
    from precision_nb.engine.numerics.hardware import WHATIF_GPUS

    assert set(cli.FORMAT_NAMES) == set(FORMATS) | set(BLOCK_FORMATS)
    assert set(BLOCK_ALIASES) <= set(cli.FORMAT_ALIASES)
    resolve_formats(cli.FORMAT_ALIASES)  # every spelling the flag accepts, the engine accepts
    assert set(cli.HARDWARE_NAMES) == set(WHATIF_GPUS)
