"""Views: figures, tables, reports, the panel and the CLI.

Submodules import matplotlib / ipywidgets / pandas; this package itself imports none of them.
"""
