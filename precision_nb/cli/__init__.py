"""The command line: ``precision-nb plan`` and ``precision-nb profile`` (see ``main``)."""

from precision_nb.cli.main import main

__all__ = ["main"]
