"""``--model`` / ``--batches``: your own model and batches from import paths, for every command.

``--model package.module:factory`` names a callable returning an ``nn.Module``; ``--batches
package.module:name`` names the batches (a list, a DataLoader, a callable of the microbatch index,
or a callable without arguments returning one of those) and defaults to the name ``batches`` in
the factory's module. The current folder is importable, as with ``python -m``. Every problem is a
``ValueError`` naming the flag, the value and what is allowed; torch loads only when called.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import Any

from precision_nb.core.defaults import (
    DEFAULT_PRESET,
    DEFAULT_WORKLOAD,
    PRESET_NAMES,
    WORKLOAD_NAMES,
)

__all__ = ["add_source_flags", "check_source", "load", "target", "user_model"]


def load(flag: str, spec: str) -> tuple[Any, Any]:
    """``package.module:name`` (``name`` may be dotted) -> (module, object)."""
    module_name, sep, name = str(spec).partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"{flag}: invalid value {spec!r}; allowed: package.module:name")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does: the current folder is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"{flag}: cannot import module {module_name!r}: {err}") from err
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{flag}: module {module_name!r} has no attribute {name!r}")
        obj = getattr(obj, part)
    return module, obj


def _required_positional(fn: Any) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: treat it as index -> batch
        return [inspect.Parameter("index", inspect.Parameter.POSITIONAL_ONLY)]
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in params if p.default is p.empty and p.kind in kinds]


def user_model(model: str | None, batches: str | None) -> tuple[Any, Any]:
    """(model, batches) for ``--model`` / ``--batches``; (None, None) without ``--model``.

    The factory is called once; a factory that raises or returns something other than an
    ``nn.Module`` is a ``ValueError`` naming ``--model``. A ``--batches`` callable that takes no
    argument is called once for the batch source; one taking the microbatch index is kept as is.
    """
    if model is None:
        if batches is not None:
            raise ValueError("--batches: given without --model; built-in workloads bring theirs")
        return None, None
    from torch import nn

    module, factory = load("--model", model)
    if not callable(factory) or isinstance(factory, nn.Module):
        raise ValueError(
            f"--model: {model} is a {type(factory).__name__}; allowed: a callable returning an "
            "nn.Module"
        )
    try:
        built = factory()
    except Exception as err:  # noqa: BLE001 - the user's own code: named, with its error
        raise ValueError(f"--model: {model}() raised {type(err).__name__}: {err}") from err
    if not isinstance(built, nn.Module):
        raise ValueError(
            f"--model: {model}() returned {type(built).__name__}; allowed: a torch.nn.Module"
        )
    if batches is not None:
        _, source = load("--batches", batches)
        where = batches
    elif hasattr(module, "batches"):
        source, where = module.batches, f"{module.__name__}:batches"
    else:
        raise ValueError(
            f"--batches: not given, and module {module.__name__!r} has no name `batches`; "
            "pass --batches package.module:name"
        )
    if callable(source) and not hasattr(source, "__iter__") and not _required_positional(source):
        try:
            source = source()  # a factory of the batch source
        except Exception as err:  # noqa: BLE001 - the user's own code: named, with its error
            raise ValueError(f"--batches: {where}() raised {type(err).__name__}: {err}") from err
    from precision_nb.engine.batches import BatchSource

    try:
        BatchSource(source)  # the kind of source; each command checks its first batch
    except ValueError as err:
        raise ValueError(f"--batches: {where}: {err}") from err
    return built, source


def add_source_flags(parser: Any, batches_help: str) -> None:
    """``--workload`` or ``--model``, ``--preset`` and ``--batches`` (help ``batches_help``)."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--workload", help="built-in workload: mlp, transformer (alias lm), cnn; default: mlp"
    )
    source.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="your own model: package.module:factory, a callable returning an nn.Module (the "
        "current folder is importable); default: none",
    )
    parser.add_argument(
        "--preset",
        help="size preset: tiny, small, medium, large; default: small for the default workload, "
        "tiny for a --workload or --model",
    )
    parser.add_argument("--batches", metavar="MODULE:NAME", help=batches_help)


def check_source(args: Any) -> None:
    """``--workload`` and ``--preset`` among the allowed names (``ValueError`` naming the flag)."""
    from precision_nb.core.validate import choice

    if args.workload is not None:
        choice("--workload", str(args.workload).strip().lower(), WORKLOAD_NAMES)
    if args.preset is not None:
        choice("--preset", str(args.preset).strip().lower(), PRESET_NAMES)


def target(args: Any) -> tuple[Any, Any, str]:
    """(model or workload name, batches or None, preset) from :func:`add_source_flags`' flags."""
    model, batches = user_model(args.model, args.batches)
    if model is not None:
        return model, batches, args.preset or "tiny"
    preset = args.preset or (DEFAULT_PRESET if args.workload is None else "tiny")
    return args.workload or DEFAULT_WORKLOAD, None, preset
