"""The README's panel image is the browser test's output for the panel's current code, and shows
a speedup with its interval (no browser needed: the PNG carries what it was made from)."""

from __future__ import annotations

from pathlib import Path

from PIL import Image

from tests.browser.readme_image import (
    COMMAND,
    HASH_KEY,
    README_IMAGE,
    TEXT_KEY,
    panel_sources_hash,
    problems,
    read_provenance,
    save_with_provenance,
)

SHOWN = (
    "bf16 is 1.31× the fp32 speed: faster (95 % interval 1.22–1.40, ±7 %; over 12 processes, 96 "
    "paired rounds in all)\nplan speedup vs fp32 (95 % CI)\nbf16 1.31× (1.22–1.40, ±7 %)"
)


def test_the_readme_image_is_the_current_panels_and_shows_the_interval() -> None:
    found = problems(README_IMAGE)
    assert not found, "\n".join(found)


def test_the_readme_links_the_image() -> None:
    readme = (README_IMAGE.parents[2] / "README.md").read_text(encoding="utf-8")
    assert f"]({README_IMAGE.relative_to(README_IMAGE.parents[2]).as_posix()})" in readme


def _screenshot(tmp_path: Path) -> Path:
    path = tmp_path / "shot.png"
    Image.new("RGB", (40, 20), "white").save(path)
    return path


def test_a_current_image_passes_and_keeps_its_text(tmp_path: Path) -> None:
    target = tmp_path / "image.png"
    save_with_provenance(_screenshot(tmp_path), target, SHOWN)
    assert read_provenance(target) == {HASH_KEY: panel_sources_hash(), TEXT_KEY: SHOWN}
    assert problems(target) == []


def test_an_image_of_older_panel_code_fails(tmp_path: Path) -> None:
    old_sources = tmp_path / "panel"
    old_sources.mkdir()
    (old_sources / "api.py").write_text("class Panel: ...\n")
    target = tmp_path / "image.png"
    save_with_provenance(_screenshot(tmp_path), target, SHOWN)
    assert problems(target) == []
    # the same image, stamped with another version of the sources
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(HASH_KEY, panel_sources_hash(old_sources))
    info.add_itxt(TEXT_KEY, SHOWN)
    with Image.open(target) as image:
        image.save(target, pnginfo=info)
    found = problems(target)
    assert len(found) == 1 and "older panel" in found[0] and COMMAND in found[0]


def test_an_image_without_the_interval_or_without_provenance_fails(tmp_path: Path) -> None:
    target = tmp_path / "image.png"
    shown = "over 3 processes\nbf16 1.793×\nfp32 1.00× (baseline)"
    save_with_provenance(_screenshot(tmp_path), target, shown)
    found = problems(target)
    assert len(found) == 1 and "interval" in found[0]
    one = SHOWN.replace("over 12 processes", "8 rounds in one process")
    save_with_provenance(_screenshot(tmp_path), target, one)
    found = problems(target)
    assert len(found) == 1 and "over fresh processes" in found[0]
    plain = _screenshot(tmp_path)  # a PNG from anywhere else: no hash, no text
    found = problems(plain)
    assert len(found) == 3 and "no panel source hash" in found[0]
    assert problems(tmp_path / "missing.png")[0].endswith(COMMAND)
