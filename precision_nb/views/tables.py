"""Deprecated module path: moved to :mod:`precision_nb.views.report.tables`."""

from precision_nb.views._moved import forwarder

__getattr__ = forwarder(__name__, "precision_nb.views.report.tables")
