"""The README's panel image: what it was made from, written into the PNG, and checked.

The browser test's picture of the panel after a comparison (its Compare tab above its Memory
tab) is saved with two PNG text chunks: a SHA-256 of the panel's source files
(``precision_nb/views/panel/*.py``: path and bytes) and the tabs' text as the browser showed it.
A file's modification time means nothing in a fresh clone; these do: :func:`problems` recomputes
the hash and reads the text, so a test fails when the image is older than the panel's code or
does not show a speedup with its interval over fresh processes.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_IMAGE = ROOT / "docs" / "images" / "panel-after-compare.png"
PANEL_SOURCES = ROOT / "precision_nb" / "views" / "panel"
HASH_KEY = "precision_nb:panel-sources-sha256"
TEXT_KEY = "precision_nb:compare-text"
#: The one command that retakes the image (also in docs/development.md and docs/panel.md).
COMMAND = "PRECISION_NB_UPDATE_SCREENSHOT=1 .venv/bin/python -m pytest tests/browser -x -q"
#: A speedup with its interval as the Compare tab shows it: "1.31× (1.22–1.40, ±7 %)".
INTERVAL = re.compile(r"\d+\.\d\d×\s*\(\d+\.\d\d–\d+\.\d\d(, ±\d+ %)?\)")
#: A verdict whose interval holds over fresh processes: "over 12 processes".
PROCESSES = re.compile(r"over ([2-9]|\d\d+) processes")


def panel_sources_hash(folder: Path = PANEL_SOURCES) -> str:
    """SHA-256 over every ``*.py`` of the panel's package, by relative path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def save_with_provenance(screenshot: Path, target: Path, compare_text: str) -> None:
    """Write ``screenshot`` to ``target`` with the panel's source hash and ``compare_text``."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(HASH_KEY, panel_sources_hash())
    info.add_itxt(TEXT_KEY, compare_text)  # international text: the table has × and –
    with Image.open(screenshot) as image:
        image.load()
        image.save(target, format="PNG", pnginfo=info, optimize=True)


def stack_images(parts: list[Path], target: Path, gap: int = 12) -> None:
    """``parts`` one above the other on white (the README's picture shows two tabs)."""
    from PIL import Image

    images = [Image.open(p).convert("RGB") for p in parts]
    width = max(i.width for i in images)
    height = sum(i.height for i in images) + gap * (len(images) - 1)
    canvas = Image.new("RGB", (width, height), "white")
    top = 0
    for image in images:
        canvas.paste(image, (0, top))
        top += image.height + gap
    canvas.save(target)


def read_provenance(path: Path) -> dict[str, str]:
    from PIL import Image

    with Image.open(path) as image:
        return {str(k): str(v) for k, v in getattr(image, "text", {}).items()}


def problems(path: Path = README_IMAGE) -> list[str]:
    """What is wrong with the image at ``path`` (empty: it is the current panel's and shows the
    interval), each with the command that fixes it."""
    if not path.exists():
        return [f"{path} is missing; make it with: {COMMAND}"]
    found = read_provenance(path)
    out = []
    stamped = found.get(HASH_KEY)
    if stamped is None:
        out.append(f"{path.name} carries no panel source hash (not made by the browser test)")
    elif stamped != panel_sources_hash():
        out.append(
            f"{path.name} shows an older panel: precision_nb/views/panel changed since it was taken"
        )
    text = found.get(TEXT_KEY, "")
    if not INTERVAL.search(text):
        shown = "'1.31× (1.22–1.40, ±7 %)'"
        out.append(f"{path.name} does not show a speedup with its interval ({shown})")
    if not PROCESSES.search(text):
        out.append(f"{path.name} does not show verdicts over fresh processes ('over 12 processes')")
    return [f"{problem}; retake it with: {COMMAND}" for problem in out]
