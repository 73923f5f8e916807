"""``python -m tools.bench.fused`` (``__main__.py``): the fused tier's
steady state; its rows and variants (``variants.py``), the child processes'
side (``child.py``) and its tables and results rows (``report.py``)."""
