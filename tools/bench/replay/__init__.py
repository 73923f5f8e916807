"""``python -m tools.bench.replay`` (``__main__.py``): steady-state replay;
its sections (``steady.py``, ``overheads.py``, ``memory.py``) and how they
time their variants (``timing.py``)."""
