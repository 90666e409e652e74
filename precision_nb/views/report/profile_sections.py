"""The inspection and numerics sections of a profile: computed once per profile, outside the
timed steps, then written as CSVs, PNGs and HTML sections of ``report.html``.

- :func:`inspect_plans`: the engine's :func:`~precision_nb.engine.inspect.run_inspection` of each
  measured plan (memory by kind and dtype, op dtype trace);
- :func:`analyze_numerics`: one fp32 gradient analysis of the model (underflow by layer and
  format, the safe fp16 scale window), with the scale history of the scaled plan overlaid;
- :func:`write_sections`: the files and the HTML the report embeds.
"""

from __future__ import annotations

import html
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "NUMERICS_FILES",
    "add_sections",
    "analyze_numerics",
    "inspect_plans",
    "numerics_section",
    "scaled_run",
    "write_sections",
]

log = logging.getLogger(__name__)

#: The numerics files of a report (the activation heat map only when there are activation rows).
NUMERICS_FILES = (
    "numerics.csv",
    "numerics_gradient_underflow.png",
    "numerics_activation_underflow.png",
    "numerics_scale_window.png",
)


def add_sections(request: Any, comparison: Any, result: Any) -> None:
    """Inspect each plan and analyse the numerics, after the timed steps; say what it cost.

    A failure here (e.g. out of memory in the instrumented step) leaves the section out, with a
    ``warning`` event and a logged warning: the measurement is kept.
    """
    from precision_nb.core.events import Event

    jobs = (
        # A distributed profile has per-rank memory from its run; the inspection is one process's.
        (
            "inspection",
            request.inspect and not request.distributed,
            inspect_plans,
            "inspections",
        ),
        ("numerics", request.numerics, analyze_numerics, "numerics"),
    )
    for name, wanted, run, attr in jobs:
        if not wanted or not getattr(comparison, "results", None):
            continue
        try:
            value, seconds = run(request, comparison)
        except (RuntimeError, ValueError) as exc:
            message = f"the {name} section was left out: {type(exc).__name__}: {exc}"
            log.warning(message)
            comparison.events.append(Event("warning", message, {"section": name}))
            continue
        setattr(result, attr, value)
        result.settings[f"{name} (after the timed steps)"] = f"{seconds:.1f} s"


def _model_source(request: Any) -> tuple[Any, Any, Any]:
    """(model or workload name, batches, loss_fn) of a profile request."""
    if request.model is not None:
        return request.model, request.batches, request.loss_fn
    return request.workload, None, None


def inspect_plans(request: Any, comparison: Any) -> tuple[dict[str, Any], float]:
    """Label -> ``InspectionData`` for every plan that ran; and the seconds it took.

    Runs after the measurement on a copy of the model, so it never touches the speed figures.
    """
    from precision_nb.engine.inspect import run_inspection

    model, batches, loss_fn = _model_source(request)
    failed = getattr(comparison, "failures", None) or {}
    start = time.perf_counter()
    out: dict[str, Any] = {}
    for label, result in (getattr(comparison, "results", None) or {}).items():
        if label in failed:
            continue
        out[label] = run_inspection(
            model,
            batches,
            result.plan,
            preset=request.preset,
            loss_fn=loss_fn,
            device=result.device,
        )
    return out, time.perf_counter() - start


def scaled_run(comparison: Any) -> Any:
    """The first run with a grad scaler and a scale history (the fp16 plan), or None."""
    for result in (getattr(comparison, "results", None) or {}).values():
        if getattr(result.plan, "use_scaler", False) and result.scale_history:
            return result
    return None


def analyze_numerics(request: Any, comparison: Any) -> tuple[Any, float]:
    """A :class:`~precision_nb.views.report.numerics.Numerics` of the profiled model and the
    seconds it took; the fp16 plan's scale history is overlaid when there is one."""
    from precision_nb.engine.numerics.analysis import analyze
    from precision_nb.views.report.numerics import Numerics

    model, batches, loss_fn = _model_source(request)
    run = scaled_run(comparison)
    history = run.scale_history if run is not None else []
    scales = [h.get("loss_scale") for h in history if h.get("loss_scale")]
    devices = [r.device for r in (getattr(comparison, "results", None) or {}).values()]
    start = time.perf_counter()
    result = analyze(
        model,
        batches,
        loss_fn=loss_fn,
        device=devices[0] if devices else request.device,
        scale=scales[-1] if scales else None,
        preset=request.preset,
    )
    return Numerics(result, run), time.perf_counter() - start


def write_sections(
    out: Path,
    inspections: Mapping[str, Any] | None,
    numerics: Any,
    distributed: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Path], list[str]]:
    """Write the distributed, inspection and numerics files into ``out``; (name -> path, HTML
    sections in that order)."""
    files: dict[str, Path] = {}
    sections: list[str] = []
    if distributed:
        from precision_nb.views.report.profile_distributed import write_distributed

        written, section = write_distributed(out, distributed)
        files.update(written)
        sections.append(section)
    if inspections:
        from precision_nb.views.report.html import _img_html
        from precision_nb.views.report.inspection import inspection_html, write_inspection

        written = write_inspection(inspections, out)
        files.update(written)
        # The figures were just written: embed those PNGs instead of drawing them again.
        page = inspection_html(inspections, level=2, figures=False)
        images = "".join(
            _img_html(Path(name).stem, path.read_bytes())
            for name, path in written.items()
            if name.endswith(".png")
        )
        head, sep, rest = page.partition("</p>")
        sections.append(head + sep + images + rest)
    if numerics is not None:
        written, section = _write_numerics(out, numerics)
        files.update(written)
        sections.append(section)
    return files, sections


def _write_numerics(out: Path, numerics: Any) -> tuple[dict[str, Path], str]:
    from precision_nb.views.report.figures import figure_to_png

    files: dict[str, Path] = {}
    path = out / "numerics.csv"
    numerics.gradients.to_csv(path, index=False)
    files[path.name] = path
    pngs: dict[str, bytes] = {}
    for stem, fig in numerics.figures().items():
        name = f"numerics_{stem}.png"
        pngs[name] = figure_to_png(fig)
        (out / name).write_bytes(pngs[name])
        files[name] = out / name
    return files, numerics_section(numerics, pngs)


def numerics_section(numerics: Any, pngs: Mapping[str, bytes]) -> str:
    """The report's numerics section: the window in words, findings, figures, tables."""
    from precision_nb.views.report.html import _img_html
    from precision_nb.views.report.numerics import METHOD, _fp8_table, _stagnation_table

    e = html.escape
    info = numerics.info
    run = numerics.run
    overlay = (
        f" The scale history of the {e(str(run.label))} plan is drawn over the window."
        if run is not None
        else " No plan here ran with a grad scaler, so no scale history is drawn."
    )
    parts = [
        '<section class="numerics"><h2>Numerics: gradient underflow and the fp16 scale window</h2>',
        f"<p>{e(METHOD)} Device {e(str(info.get('device')))}; fp16 also at loss scale "
        f"{e(str(info.get('scale')))}.{overlay} Per-layer rows are in numerics.csv.</p>",
        f"<p><b>{e(numerics.window_text())}</b></p>",
    ]
    if numerics.findings:
        items = "".join(f"<li>{e(f.message)}</li>" for f in numerics.findings)
        parts.append(f"<ul>{items}</ul>")
    parts += [_img_html(Path(name).stem, png) for name, png in pngs.items()]
    parts.append("<h3>Update stagnation (one optimizer step)</h3>")
    parts.append(_stagnation_table(numerics.result.stagnation))
    parts.append("<h3>FP8 what-if (per-tensor amax scaling; a simulation)</h3>")
    parts.append(f"<p>{e(str(info.get('fp8', {}).get('text', '')))}</p>")
    parts.append(_fp8_table(numerics.result.fp8))
    parts.append("</section>")
    return "\n".join(parts)
