"""True plans on the command line: every flag that takes a precision takes their spelling, and a
bad true request exits 2 naming the flag, the value and what is allowed, before anything runs."""

from __future__ import annotations

import pytest

from precision_nb.cli.main import main


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--mode", "BF16-true+Kahan", "--device", "cpu"],
        ["plan", "--mode", "fp16-true", "--simulate", "cuda-bf16"],
    ],
)
def test_true_spellings_are_taken(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "weights      true" in out


@pytest.mark.parametrize(
    "argv,words",
    [
        (["plan", "--mode", "fp32-true"], ["--mode: invalid value 'fp32-true'", "no true variant"]),
        (
            ["inspect", "--precision", "bf16,bf16-true+magic"],
            ["--precision: invalid value 'bf16-true+magic'", "unknown remedy 'magic'", "+kahan"],
        ),
        (
            ["profile", "--compare", "fp32,fp32-true"],
            ["--compare: invalid value 'fp32-true'", "allowed: bf16-true, fp16-true"],
        ),
        (
            ["plan", "--mode", "bf16-true+kahan", "--fused", "true"],
            ["--fused: invalid value true with remedy 'kahan'", "--fused auto or false"],
        ),
        (
            ["profile", "--compare", "fp32,bf16-true+stochastic", "--fused", "true"],
            ["--fused: invalid value true with remedy 'stochastic'", "no remedy with --fused true"],
        ),
        (
            ["plan", "--mode", "fp16-true", "--fused", "false", "--simulate", "cuda-bf16"],
            ["--fused: invalid value false for fp16-true", "--fused auto or true"],
        ),
    ],
)
def test_bad_true_requests_exit_2_naming_the_flag(capsys, tmp_path, argv, words):
    if argv[0] in ("profile", "inspect"):
        argv = [*argv, "--out", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err
    assert "optimizer.fused" not in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
