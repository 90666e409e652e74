"""Reading a run config's YAML safely, without torch: files, strings and dicts.

``read_source`` returns the plain data of a YAML file path, a YAML string or a mapping. Loading is
``yaml.safe_load`` (no tag can construct an object) after one pass over the parser's events that
refuses a document nested deeper than :data:`MAX_DEPTH` or expanding beyond :data:`MAX_NODES`
nodes once its aliases are expanded (an alias bomb is measured, never expanded). Parser and scanner
errors become ``ValueError`` with the file, line and column and what the parser expected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_nb.core.validate import short_repr

SECTIONS: dict[str, tuple[str, ...]] = {
    "device": ("requested",),
    "precision": ("mode", "dtype", "loss_scale_lab", "weights", "remedy"),
    "optimizer": ("lr", "betas", "eps", "weight_decay", "fused"),
}

#: Most nodes a config document may expand to (aliases counted each time they are used).
MAX_NODES = 10_000
#: Deepest nesting of collections a config document may have.
MAX_DEPTH = 32
#: Largest config file read, in bytes.
MAX_FILE_BYTES = 1 << 20


def _yaml_error(exc: Any, where: str) -> ValueError:
    import yaml

    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    if isinstance(exc, yaml.constructor.ConstructorError):
        return ValueError(
            f"config: {where}{at}: YAML tag refused (only plain data is read: mappings, lists, "
            f"strings, numbers, booleans, null): {detail}"
        )
    return ValueError(f"config: {where} is not valid YAML{at}: {detail}")


def _check_size(text: str, where: str) -> None:
    """Refuse a document nested deeper than :data:`MAX_DEPTH` or expanding beyond
    :data:`MAX_NODES`. Iterative, no recursion: each anchor remembers how many nodes it stands
    for, and each alias (``*name``) adds that many again."""
    import yaml

    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[None, 0]]  # [anchor, nodes so far] per open collection

    def add(count: int, anchor: str | None) -> None:
        if anchor is not None:
            anchors[anchor] = count
        stack[-1][1] += count
        if stack[-1][1] > MAX_NODES:
            raise ValueError(
                f"config: {where} expands to more than {MAX_NODES} YAML nodes once its aliases "
                "(*name) are expanded; a run config is a few dozen - refused"
            )

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append([event.anchor, 1])
            if len(stack) > MAX_DEPTH:
                raise ValueError(
                    f"config: {where} is nested more than {MAX_DEPTH} levels deep; a run config "
                    "has three at most"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, count = stack.pop()
            add(count, anchor)
        elif isinstance(event, yaml.ScalarEvent):
            add(1, event.anchor)
        elif isinstance(event, yaml.AliasEvent):
            # An alias to a collection still open (a node containing itself) has no size yet.
            if event.anchor not in anchors:
                raise ValueError(
                    f"config: {where} has an alias *{short_repr(event.anchor)} inside the node it "
                    "names (a recursive structure); a run config holds plain values - refused"
                )
            add(anchors[event.anchor], None)


def _safe_load(text: str, where: str) -> Any:
    import yaml  # PyYAML only when a config is loaded

    try:
        _check_size(text, where)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, where) from None


def _looks_like_path(text: str) -> bool:
    """One line that cannot be a YAML mapping ("run.yaml", "configs/", "C:\\x.yml")."""
    return bool(text) and "\n" not in text and not text.startswith(("{", "#")) and ": " not in text


def _read_file(path: Path) -> str:
    where = repr(str(path))
    if path.is_dir():
        raise IsADirectoryError(f"config: {where} is a directory; give a YAML file")
    if not path.exists():
        raise FileNotFoundError(f"config: {where} not found (no such file)")
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ValueError(
            f"config: {where} is {size} bytes; a run config is at most {MAX_FILE_BYTES} bytes"
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"config: {where} is not UTF-8 text ({exc.reason})") from None
    except PermissionError:
        raise PermissionError(f"config: {where} cannot be read (permission denied)") from None


def read_source(source: Any) -> Any:
    """Plain data of a YAML file path (``str`` or ``Path``), a YAML string or a mapping."""
    if isinstance(source, Mapping):
        return source
    if isinstance(source, Path):
        return _safe_load(_read_file(source), repr(str(source)))
    if isinstance(source, str):
        text = source.strip()
        if _looks_like_path(text) and (
            text.endswith((".yaml", ".yml")) or os.path.exists(text) or os.sep in text
        ):
            return _safe_load(_read_file(Path(text)), repr(text))
        data = _safe_load(source, "the YAML text")
        if isinstance(data, str) and _looks_like_path(text):
            # One word that is no file: say so rather than "got str".
            raise FileNotFoundError(
                f"config: {short_repr(text)} not found (no such file), and as YAML it is a "
                "single string, not a mapping with sections "
                f"{', '.join(map(repr, SECTIONS))}"
            )
        return data
    raise ValueError(
        f"config: invalid value of type {type(source).__name__}; expected a YAML file path, "
        "a YAML string or a dict"
    )
