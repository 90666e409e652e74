"""The answer first: one line (terminal) or one card (report, notebook) per plan.

A card holds the plan's verdict with its interval, its memory by kind saved or added against the
baseline, its numerics risk (share of gradients that flush to 0 in its format, skipped steps) and
its drift from fp32, read from the comparison's typed outcomes. The verdict's words are the
engine's (:mod:`precision_nb.engine.stats`), rendered by :func:`verdict_view` only.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from precision_nb.core.text import times_text
from precision_nb.engine.comparison import Comparison, PlanOutcome
from precision_nb.engine.numerics.fp16_run import counted_in_fp16
from precision_nb.engine.true_figures import LostUpdates, TrueSaving
from precision_nb.views.colors import colors_for_labels
from precision_nb.views.report.hint import is_number, share_text
from precision_nb.views.report.hints import Hint
from precision_nb.views.report.markup import fmt, size_text
from precision_nb.views.report.sections import Section

__all__ = [
    "PlanAnswer",
    "VerdictView",
    "answer_section",
    "answers",
    "cards_html",
    "merge_notes",
    "other_hints",
    "terminal_lines",
    "verdict_view",
]


@dataclass(frozen=True)
class VerdictView:
    """A plan's verdict as the engine worded it, and its kind."""

    text: str
    kind: str


def verdict_view(outcome: PlanOutcome | None) -> VerdictView | None:
    """The one reader of a plan's verdict (None when the plan has none)."""
    verdict = outcome.verdict if outcome is not None else None
    return None if verdict is None else VerdictView(str(verdict), verdict.kind)


@dataclass(frozen=True)
class PlanAnswer:
    """What one card says about one plan (texts, ready to show; nothing here is measured)."""

    label: str
    color: str
    verdict: VerdictView | None
    memory: tuple[str, ...]
    numerics: tuple[str, ...]
    drift: str
    #: (request, sentence) for each request merged into this plan's run.
    merged: tuple[tuple[str, str], ...] = ()
    failed: str = ""
    #: A compiled plan's compile lines: against its eager twin, the compile step, pay-back.
    compile: tuple[str, ...] = ()


def answers(
    comparison: Comparison,
    *,
    inspections: Mapping[str, Any] | None = None,
    numerics: Any = None,
) -> list[PlanAnswer]:
    """One :class:`PlanAnswer` per plan of ``comparison``."""
    labels = list(comparison.results)
    colors = colors_for_labels(labels)
    base = next((k for k in labels if comparison.results[k].plan.mode == "fp32"), None)
    memory = _memory_by_kind(inspections or {})
    merged = merge_notes(comparison)
    out = []
    for label in labels:
        outcome = comparison.outcome(label)
        out.append(
            PlanAnswer(
                label=label,
                color=colors[label],
                verdict=verdict_view(outcome),
                memory=_memory_lines(label, base, memory) + _saving_lines(outcome.saving),
                numerics=_numerics_lines(comparison.results[label], numerics)
                + _lost_lines(outcome.lost_updates),
                drift=_drift_line(label, base, outcome),
                merged=tuple((req, text) for req, run, text in merged if run == label),
                failed=str(outcome.failure or ""),
                compile=_compile_lines(outcome.compiled),
            )
        )
    return out


def _compile_lines(report: Any) -> tuple[str, ...]:
    """A compiled plan's card lines, in the engine's words: its verdict against the eager twin,
    the compile step and its cache outcome, the pay-back (details in the compile section)."""
    if report is None:
        return ()
    record = report.record
    if record.failure is not None:
        return (f"compile failed: {record.failure}",)
    lines = [report.verdict] if report.verdict else []
    if record.compile_s is not None:
        lines.append(f"compile step {record.compile_s:.2f} s (cache {record.cache}), not timed")
    if report.pay_back is not None:
        lines.append(report.pay_back.text.split(":", 1)[0])
    return tuple(lines)


# ----------------------------------------------------------------------------- memory


def _memory_by_kind(inspections: Mapping[str, Any]) -> dict[str, dict[str, tuple[int, str]]]:
    """Label -> kind -> (counted bytes, dtypes) from each plan's inspection."""
    out: dict[str, dict[str, tuple[int, str]]] = {}
    for label, item in inspections.items():
        data = getattr(item, "data", item)  # an Inspection or its InspectionData
        kinds: dict[str, list[Any]] = {}
        for r in data.memory:
            if not r.get("counted"):
                continue
            entry = kinds.setdefault(r["kind"], [0, []])
            entry[0] += int(r.get("expected_bytes" if data.simulated else "bytes") or 0)
            if r.get("dtype") and r["dtype"] not in entry[1]:
                entry[1].append(r["dtype"])
        out[label] = {k: (v[0], "+".join(v[1])) for k, v in kinds.items()}
    return out


def _memory_lines(
    label: str, base: str | None, memory: Mapping[str, Mapping[str, tuple[int, str]]]
) -> tuple[str, ...]:
    mine = memory.get(label)
    if mine is None:
        return ("not inspected (the inspection of memory by kind was left out)",)
    total = sum(b for b, _ in mine.values())
    if base is None or label == base or base not in memory:
        if label == base:
            what = "the reference"
        elif base is None:
            what = "no fp32 plan to compare with"
        else:
            what = f"{base} was not inspected: nothing to compare with"
        return (f"{size_text(total)} counted in one training step ({what})",)
    ref = memory[base]
    ref_total = sum(b for b, _ in ref.values())
    lines = [
        f"{size_text(total - ref_total, signed=True)} against {base} "
        f"({size_text(ref_total)} -> {size_text(total)} counted in one step)"
    ]
    for kind in dict.fromkeys([*ref, *mine]):
        now, dtypes = mine.get(kind, (0, ""))
        before = ref.get(kind, (0, ""))[0]
        if now != before:
            word = "saved" if now < before else "added"
            where = f" ({dtypes})" if dtypes else ""
            lines.append(f"{kind}{where}: {size_text(now - before, signed=True)} {word}")
    return tuple(lines)


def _saving_lines(saving: TrueSaving | None) -> tuple[str, ...]:
    """A true plan's saving against its mixed twin (the outcome's, by the inspected bytes)."""
    if saving is None or not saving.before:
        return ()
    line = (
        f"against {saving.mixed} (mixed): parameters, gradients and optimizer state "
        f"{size_text(saving.before)} -> {size_text(saving.after)} "
        f"({times_text(saving.ratio, '.3f')})"
    )
    if saving.kept:
        line += (
            f"; the tensors held in {saving.dtype} {times_text(saving.cast_ratio, '.3f')}, with "
            f"{size_text(saving.kept)} kept outside {saving.dtype} (the optimizer's step counters)"
        )
    lines = [line]
    if saving.kahan:
        lines.append(
            f"Kahan compensation buffers ({saving.kahan_dtypes}): {size_text(saving.kahan)} more"
        )
    return tuple(lines)


def _lost_lines(lost: LostUpdates | None) -> tuple[str, ...]:
    """The run's measured lost updates at its last measured step (the outcome's)."""
    if lost is None:
        return ()
    return (
        f"updates rounded away at step {lost.step}: {lost.updates_rounded_away:.1%} of "
        f"the weights; never moved since the start: {lost.weights_never_moved:.1%} "
        "(measured on the run's weights)",
    )


# ----------------------------------------------------------------------------- numerics


def _variant_of(label_mode: str, use_scaler: bool, rows: Sequence[Mapping[str, Any]]) -> str:
    """The analysis variant that matches a plan: its mode, at the loss scale when it scales."""
    variants = list(dict.fromkeys(str(r.get("variant")) for r in rows))
    scaled = [v for v in variants if use_scaler and v.startswith(f"{label_mode} x")]
    if scaled:
        return scaled[0]
    return label_mode if label_mode in variants else ""


def _numerics_lines(result: Any, numerics: Any) -> tuple[str, ...]:
    plan = result.plan
    mode = str(plan.mode)
    lines = []
    if numerics is None:
        lines.append("gradient underflow not analysed (the numerics analysis was left out)")
    elif mode == "fp32":
        lines.append("gradients stay in fp32 (the reference)")
    else:
        grads = [r for r in numerics.result.gradients if r.get("status") == "ok"]
        variant = _variant_of(mode, bool(plan.use_scaler), grads)
        chosen = [r for r in grads if r.get("variant") == variant]
        basis = "one batch, fp32 gradients cast"
        if variant.startswith("fp16"):  # the scale window's rule: fp16-held gradients only
            run = (getattr(numerics.result, "info", None) or {}).get("fp16_run") or {}
            traced = bool(run) and run.get("error") is None
            every = len({r.get("layer") for r in chosen})
            chosen = [r for r in chosen if counted_in_fp16(r.get("fp16_run"), traced)]
            basis += (
                f"; the {len({r.get('layer') for r in chosen})} of {every} gradient tensors a "
                "real fp16 step holds in fp16"
                if traced
                else "; every gradient: which ones a real fp16 step holds in fp16 was not traced"
            )
        live = sum(int(r.get("live") or 0) for r in chosen)
        if variant and live:
            under = sum(int(r.get("underflow") or 0) for r in chosen)
            lines.append(
                f"{share_text(under / live)} of non-zero gradient values flush to 0 in {variant} "
                f"({basis})"
            )
        else:
            lines.append(f"gradient underflow in {mode}: not in the analysis")
    if plan.use_scaler:
        lines.append(
            f"skipped steps (overflow): {fmt(result.skipped_total)} of {result.steps} counted"
        )
    else:
        lines.append("skipped steps: none by design (no grad scaler skips a step)")
    return tuple(lines)


def _drift_line(label: str, base: str | None, outcome: PlanOutcome) -> str:
    if base is None:
        return "no fp32 plan to compare with"
    if label == base:
        return "the reference"
    drift = outcome.drift
    loss, params = (drift.final_loss_diff, drift.param_rel_diff) if drift else (None, None)
    parts = []
    if is_number(loss):
        parts.append(f"final loss {loss:+.4g} against {base}")
    if is_number(params):
        parts.append(f"parameters {params:.3%} apart (relative L2)")
    return "; ".join(parts) or "not measured"


def merge_notes(comparison: Comparison) -> list[tuple[str, str, str]]:
    """(request, run, sentence) for each request merged into another plan's run."""
    out = []
    for request, run in comparison.merged.items():
        if request == run:
            continue
        result = comparison.results.get(run)
        plan = result.explanation.summary() if result and result.explanation else ""
        text = f"{request} resolved to the same plan as {run}{f' ({plan})' if plan else ''}"
        text += ", so it was run once."
        for e in comparison.events:
            if e.kind == "merged" and e.data.get("label") == request and e.data.get("why"):
                text += f" Why: {e.data['why']}"
                break
        out.append((request, run, text))
    return out


def other_hints(hint_list: Sequence[Hint], shown: Sequence[PlanAnswer]) -> list[Hint]:
    """The hints that do not repeat a verdict already shown on a card or a line."""
    verdicts = {a.verdict.text for a in shown if a.verdict is not None}
    return [h for h in hint_list if h.message not in verdicts]


# ----------------------------------------------------------------------------- rendering


def cards_html(plans: Sequence[PlanAnswer]) -> str:
    """One card per plan: verdict first, then memory, numerics and drift."""
    e = html.escape
    cards = []
    for a in plans:
        head = f'<h3>{e(a.label)}</h3><p class="verdict">'
        head += e(a.verdict.text) if a.verdict else "No interleaved measurement: no verdict."
        head += "</p>"
        items = [("memory", line) for line in a.memory]
        items += [("numerics", line) for line in a.numerics]
        items.append(("drift from fp32", a.drift))
        items += [("torch.compile", line) for line in a.compile]
        if a.failed:
            items.append(("failed", a.failed))
        if a.merged:
            names = ", ".join(request for request, _ in a.merged)
            items.append(("also requested as", f"{names} (the same plan, run once; see below)"))
        body = "".join(
            f"<dt>{e(name) if i == 0 or items[i - 1][0] != name else ''}</dt><dd{_css(v)}>"
            f"{e(v)}</dd>"
            for i, (name, v) in enumerate(items)
        )
        cards.append(
            f'<div class="card" data-plan="{e(a.label)}" style="--plan:{e(a.color)}">'
            f"{head}<dl>{body}</dl></div>"
        )
    return f'<div class="cards">{"".join(cards)}</div>'


def _css(line: str) -> str:
    word = next((w for w in ("saved", "added") if line.endswith(f" {w}")), "")
    return f' class="{word}"' if word else ""


def answer_section(plans: Sequence[PlanAnswer], load_note: str = "") -> Section:
    """The report's first section: a busy machine said first (``load_note``), the cards, then
    the requests merged into another's run."""
    e = html.escape
    busy = f'<p class="load-note"><b>{e(load_note)}</b></p>' if load_note else ""
    notes = [f"<li>{e(text)}</li>" for a in plans for _, text in a.merged]
    merged = (
        '<div class="merged"><b>Requests merged</b> (same resolved plan, same seed: running them '
        f"twice would only measure noise)<ul>{''.join(notes)}</ul></div>"
        if notes
        else ""
    )
    return Section("answer", "The answer, plan by plan", busy + cards_html(plans) + merged)


def terminal_lines(plans: Sequence[PlanAnswer]) -> list[str]:
    """One line per plan, verdict first (plain text), then a line per merged request."""
    width = max((len(a.label) for a in plans), default=0)
    lines = []
    for a in plans:
        text = a.verdict.text if a.verdict else "no interleaved measurement: no verdict"
        lines.append(f"{a.label:<{width}}  {text}")
    lines += [f"merged: {note}" for a in plans for _, note in a.merged]
    return lines
