"""Deprecated module path: moved to :mod:`precision_nb.cli.main`."""

from precision_nb.views._moved import forwarder

__getattr__ = forwarder(__name__, "precision_nb.cli.main")
