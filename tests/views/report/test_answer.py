"""The answer first: one card / line per plan, the engine's verdict words, memory by kind saved or
added, numerics risk and drift; fields the report does not know are shown, not dropped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from precision_nb.core.events import Event
from precision_nb.views.report.answer import (
    answers,
    cards_html,
    other_hints,
    terminal_lines,
    verdict_view,
)
from precision_nb.views.report.hint import Hint

VERDICT = "bf16 is 1.31x the fp32 speed (95 % CI 1.22-1.40, 8 rounds)."


def _memory(*rows):
    return SimpleNamespace(
        simulated=False,
        memory=[{"kind": k, "dtype": d, "bytes": b, "counted": True} for k, d, b in rows]
        + [{"kind": "process memory (host RSS)", "dtype": None, "bytes": 10**9, "counted": False}],
    )


@pytest.fixture
def comparison(make_result, make_comparison):
    return make_comparison(
        fp32=make_result("fp32", "fp32"),
        bf16=make_result("bf16", "bf16"),
        fp16=make_result("fp16", "fp16", use_scaler=True, skipped_at=(3,)),
        drift={
            "bf16": {"final_loss_diff": -0.0125, "param_rel_diff": 0.014},
            "fp16": {"final_loss_diff": None, "param_rel_diff": None},
        },
        merged={"half": "fp16"},
        events=[Event("merged", "half -> fp16", {"label": "half", "why": "same dtype"})],
        figures={
            "fp32": {"verdict": "fp32 is the baseline.", "verdict_kind": "baseline"},
            "bf16": {
                "verdict": VERDICT,
                "verdict_kind": "faster",
                "speedup_vs_fp32": 1.31,
                "median_step_time_s": 0.01,
            },
        },
    )


@pytest.fixture
def plans(comparison):
    inspections = {
        "fp32": _memory(("parameters", "fp32", 4000), ("activations saved", "fp32", 3000)),
        "bf16": _memory(
            ("parameters", "fp32", 4000),
            ("autocast weight copies", "bf16", 2000),
            ("activations saved", "bf16", 1500),
        ),
    }
    grads = [
        {"status": "ok", "variant": v, "live": 1000, "underflow": u}
        for v, u in (("bf16", 0), ("fp16", 40), ("fp16 x2^16", 2))
    ] + [{"status": "ok", "variant": "bf16", "live": 1000, "underflow": 10}]
    numerics = SimpleNamespace(result=SimpleNamespace(gradients=grads))
    return answers(comparison, inspections=inspections, numerics=numerics)


def test_the_verdict_is_the_engines_text_and_kind():
    from precision_nb.engine.comparison import PlanOutcome
    from precision_nb.engine.stats import Verdict

    verdict = Verdict("slower", "x is 0.80x: slower.", "Measure longer.")
    view = verdict_view(PlanOutcome("x", verdict=verdict))
    assert (view.text, view.kind) == ("x is 0.80x: slower. Measure longer.", "slower")
    assert verdict_view(PlanOutcome("x")) is None and verdict_view(None) is None


def test_one_answer_per_plan_with_memory_numerics_and_drift(plans):
    by = {a.label: a for a in plans}
    assert list(by) == ["fp32", "bf16", "fp16"]
    bf16 = by["bf16"]
    assert bf16.verdict.text == VERDICT
    assert bf16.memory[0].startswith("+500 B against fp32 (6.84 KiB -> 7.32 KiB")
    assert "autocast weight copies (bf16): +1.95 KiB added" in bf16.memory
    assert "activations saved (bf16): -1.46 KiB saved" in bf16.memory
    assert bf16.numerics[0].startswith("0.5% of non-zero gradient values flush to 0 in bf16")
    assert bf16.numerics[1].startswith("skipped steps: none by design")
    assert bf16.drift == "final loss -0.0125 against fp32; parameters 1.400% apart (relative L2)"
    fp16 = by["fp16"]
    assert fp16.numerics[0].startswith("0.2% of non-zero gradient values flush to 0 in fp16 x2^16")
    assert "which ones a real fp16 step holds in fp16 was not traced" in fp16.numerics[0]
    assert fp16.numerics[1] == "skipped steps (overflow): 1 of 10 counted"
    assert fp16.memory == ("not inspected (the inspection of memory by kind was left out)",)
    assert fp16.drift == "not measured"
    assert fp16.verdict is None
    assert fp16.merged[0][0] == "half" and fp16.merged[0][1].endswith("Why: same dtype")
    fp32 = by["fp32"]
    assert fp32.drift == "the reference" and "the reference" in fp32.memory[0]


def test_cards_and_terminal_lines_say_the_verdict_once(plans):
    page = cards_html(plans)
    assert page.count(VERDICT) == 1 and page.count('class="card"') == 3
    assert 'class="saved"' in page and 'class="added"' in page
    lines = terminal_lines(plans)
    assert lines[0] == "fp32  fp32 is the baseline."
    assert lines[1] == f"bf16  {VERDICT}"
    assert lines[2].startswith("fp16  no interleaved measurement: no verdict")
    assert (
        lines[3]
        == "merged: half resolved to the same plan as fp16, so it was run once. Why: same dtype"
    )
    assert sum(VERDICT in line for line in lines) == 1


def test_hints_that_repeat_a_shown_verdict_are_left_out(plans):
    repeat = Hint("bf16", "payoff", VERDICT, "speedup_vs_fp32")
    other = Hint("all", "noise", "Step times varied widely", "step_time_iqr_s")
    assert other_hints([repeat, other], plans) == [other]


def test_a_true_plan_card_says_its_saving_against_the_mixed_plan_and_its_lost_updates(
    make_result, make_comparison
):
    import dataclasses

    true = make_result("bf16-true", "bf16")
    true.plan = dataclasses.replace(true.plan, weights="true", remedy="kahan")
    true.update_stats = [
        {"step": 10, "updates_rounded_away": 0.9, "weights_never_moved": 0.05, "layers": {}}
    ]
    comparison = make_comparison(
        fp32=make_result("fp32", "fp32"), bf16=make_result("bf16", "bf16"), **{"bf16-true": true}
    )
    inspections = {
        "fp32": _memory(("parameters", "fp32", 4000)),
        "bf16": _memory(
            ("parameters", "fp32", 4000), ("gradients", "fp32", 4000),
            ("optimizer state", "fp32", 8024),
        ),
        "bf16-true": _memory(
            ("parameters", "bf16", 2000), ("gradients", "bf16", 2000),
            ("optimizer state", "bf16", 4000), ("optimizer state", "fp32", 24),
            ("Kahan compensation buffers", "bf16", 2000),
        ),
    }  # fmt: skip
    comparison.attach_inspections(inspections)  # the engine sets each true plan's saving
    saving = comparison.outcome("bf16-true").saving
    assert (saving.mixed, saving.before, saving.after, saving.kept) == ("bf16", 16024, 8024, 24)
    assert saving.cast_ratio == 0.5 and saving.kahan == 2000
    by = {a.label: a for a in answers(comparison, inspections=inspections)}
    card = by["bf16-true"]
    assert "against bf16 (mixed): parameters, gradients and optimizer state" in card.memory[-2]
    assert (
        f"({8024 / 16024:.3f}x); the tensors held in bf16 0.500x, with 24 B kept"
        in (card.memory[-2])
    )
    assert card.memory[-1] == "Kahan compensation buffers (bf16): 1.95 KiB more"
    assert card.numerics[-1].startswith("updates rounded away at step 10: 90.0% of the weights")
    assert not any("(mixed)" in line for line in by["bf16"].memory)


def test_the_fp16_flush_count_follows_the_scale_window_s_rule(comparison):
    # a transformer's norms and embeddings: autocast keeps their gradients in fp32, so the
    # window leaves them out of its fp16 count; the answer card counts the same gradients
    from precision_nb.engine.numerics.analysis import analyze
    from precision_nb.views.report.hint import share_text

    result = analyze("transformer", preset="tiny", formats=("fp16",), device="cpu")
    rows = [r for r in result.gradients if r["variant"] == "fp16 x2^16" and r["status"] == "ok"]
    held = [r for r in rows if r["fp16_run"] == "fp16"]
    assert 0 < len(held) < len(rows)

    def flushed(chosen):
        return share_text(sum(r["underflow"] for r in chosen) / sum(r["live"] for r in chosen))

    assert flushed(held) != flushed(rows)  # the rule changes the number
    cards = answers(comparison, numerics=SimpleNamespace(result=result))
    (fp16,) = [a for a in cards if a.label == "fp16"]
    assert fp16.numerics[0] == (
        f"{flushed(held)} of non-zero gradient values flush to 0 in fp16 x2^16 (one batch, fp32 "
        f"gradients cast; the {len(held)} of {len(rows)} gradient tensors a real fp16 step holds "
        "in fp16)"
    )
