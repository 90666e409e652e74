"""Text and HTML of an :class:`~precision_nb.core.resolution.Explanation`.

The HTML marks rows and decisions with CSS classes (``pnb-fallback``, ``pnb-current``,
``pnb-warning``) styled by one ``<style>`` block scoped to ``.precision-nb-explanation``, so a page
that embeds it can restyle it. Every text from the explanation is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from precision_nb.core.matrix import MATRIX, RULES_DOC

if TYPE_CHECKING:  # pragma: no cover
    from precision_nb.core.resolution import Explanation

_STYLE = (
    "<style>"
    ".precision-nb-explanation .pnb-fallback{background:#fff3cd}"
    ".precision-nb-explanation .pnb-current{background:#d4edda;font-weight:bold}"
    ".precision-nb-explanation .pnb-warning{color:#a15c00}"
    "</style>"
)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def cpu_facts(e: Explanation) -> list[str]:
    """What this CPU has for the plan's low precision, for a bf16/fp16 request or plan on a CPU.

    From ``capabilities.cpu`` (:mod:`precision_nb.core.cpu_features`), with the source that
    answered; empty for other plans and for simulated hardware without CPU facts.
    """
    cpu = e.capabilities.cpu
    modes = {e.plan.mode, e.config.mode}
    if cpu is None or e.plan.device_type != "cpu" or not modes & {"bf16", "fp16"}:
        return []
    lines = [f"CPU low-precision features: {cpu.summary()}"]
    if cpu.vector_isa:
        lines.append(
            f"CPU vector ISA {cpu.vector_isa}: the level torch dispatches kernels to, not a "
            "BF16/FP16 test"
        )
    for mode, native in (("bf16", cpu.native_bf16), ("fp16", cpu.native_fp16)):
        if mode not in modes:
            continue
        names = cpu.instruction_names(mode)
        what = mode if mode == e.plan.mode else f"{mode} (requested; the plan is {e.plan.mode})"
        if native is True:
            lines.append(f"{what}: this CPU reports native instructions ({names})")
        elif native is False and mode == e.plan.mode:
            lines.append(
                f"{what}: this CPU reports no native instructions ({names}): {mode} arithmetic "
                "runs through conversions to fp32, so measure before expecting a speedup"
            )
        elif native is False:
            lines.append(f"{what}: this CPU reports no native instructions ({names})")
        else:
            lines.append(f"{what}: whether this CPU has {names} could not be read")
    return lines


def decision_lines(decisions: Sequence[Any], warnings: Sequence[str]) -> list[str]:
    """The numbered decisions (field, outcome, fallback mark, reason) and the warnings, as text
    lines: what every explanation, single-device or distributed, prints."""
    lines = ["Decisions:"]
    width = max(len(d.field) for d in decisions)
    for i, d in enumerate(decisions, 1):
        mark = " (fallback)" if d.fallback else ""
        lines.append(f"  {i}. {d.field:<{width}}  {d.outcome}{mark}: {d.reason}")
    if warnings:
        lines.append("Warnings:")
        lines.extend(f"  ! {w}" for w in warnings)
    return lines


def explanation_text(e: Explanation) -> str:
    """Readable text: the plan, the hardware, the rule that applied, decisions, warnings."""
    caps = e.capabilities
    hw = f"{caps.name}{' (simulated)' if caps.simulated else ''}: {caps.description}"
    lines = [f"Precision plan: {e.summary()}", f"Hardware: {hw}"]
    lines += [f"  {line}" for line in cpu_facts(e)]
    if e.row is not None:
        r = e.row
        lines.append(
            f"Resolution rule {r.id} ({r.source}): {r.device} | {r.request} -> {r.mode} | "
            f"scaler {_yes(r.scaler)} | autocast {_yes(r.autocast)}  [rules: {RULES_DOC}]"
        )
    lines.extend(decision_lines(e.decisions, e.warnings))
    return "\n".join(lines)


def decisions_html(decisions: Sequence[Any], warnings: Sequence[str]) -> str:
    """HTML of the numbered decisions (fallbacks marked) and the warnings: the table every
    explanation, single-device or distributed, shows."""
    esc = html.escape
    out = [
        "<table><caption>Decisions, in order</caption>"
        "<thead><tr><th>#</th><th>decision</th><th>outcome</th><th>why</th>"
        "</tr></thead><tbody>"
    ]
    for i, d in enumerate(decisions, 1):
        cls = ' class="pnb-fallback"' if d.fallback else ""
        tag = " (fallback)" if d.fallback else ""
        out.append(
            f"<tr{cls}><td>{i}</td><td>{esc(d.field)}</td><td><code>{esc(d.outcome)}</code>"
            f"{tag}</td><td>{esc(d.reason)}</td></tr>"
        )
    out.append("</tbody></table>")
    if warnings:
        out.append("<ul>")
        out.extend(f'<li class="pnb-warning">&#9888; {esc(w)}</li>' for w in warnings)
        out.append("</ul>")
    return "".join(out)


def explanation_html(e: Explanation) -> str:
    """HTML: plan, decisions (fallbacks marked), warnings, every rule (the current one marked)."""
    esc = html.escape
    caps = e.capabilities
    facts = "".join(f"<li>{esc(line)}</li>" for line in cpu_facts(e))
    out = [
        '<div class="precision-nb-explanation">',
        _STYLE,
        f"<p><b>Precision plan:</b> {esc(e.summary())}<br>",
        f"<b>Hardware:</b> {esc(caps.name)}{' (simulated)' if caps.simulated else ''}"
        f" &mdash; {esc(caps.description)}</p>",
        f'<ul class="pnb-cpu-facts">{facts}</ul>' if facts else "",
        decisions_html(e.decisions, e.warnings),
        "<table><caption>Resolution rules (listed, implied, opt-in lab; see "
        f"<code>{esc(RULES_DOC)}</code>)</caption>"
        "<thead><tr><th></th><th>device</th><th>request</th><th>resolved mode</th>"
        "<th>scaler</th><th>autocast</th><th>source</th></tr></thead><tbody>",
    ]
    current = e.row.id if e.row is not None else None
    for r in MATRIX:
        mark = r.id == current
        cls = ' class="pnb-current"' if mark else ""
        out.append(
            f'<tr{cls} data-row="{esc(r.id)}"><td>{"&#9654; applied" if mark else ""}</td>'
            f"<td>{esc(r.device)}</td><td>{esc(r.request)}</td><td>{esc(r.mode)}</td>"
            f"<td>{_yes(r.scaler).title()}</td><td>{_yes(r.autocast).title()}</td>"
            f"<td>{esc(r.source)}</td></tr>"
        )
    out.append("</tbody></table></div>")
    return "".join(out)
