"""Views: the report (tables, figures, hints, report.html, profile()) and the ipywidgets panel.

Submodules import matplotlib / ipywidgets / pandas; this package itself imports none of them.
"""
