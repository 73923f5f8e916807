"""Python's cyclic garbage collector held off while a warm start rebuilds
what it stored.

Loading a program (unpickling Dynamo's guard state, building its guard
manager) and rebuilding a plan's FX graphs allocate tens of thousands of
objects that live on. Each few hundred allocations start a collection, and
the oldest generation's collections walk every object the process holds:
about 400,000 once ``transformers`` is imported and a model built.
Measured on BART's warm first training step (docs/torch/dynamo.md#cyclic-gc-during-warm-loads):
0.51 s with the collector running, 0.31 s with it held off over the loads.

What a load keeps is long-lived by construction, and counting it is what
schedules those walks: CPython walks the oldest generation once the objects
promoted into it since the last walk reach a quarter of it. A warm
``generate`` worker through ``torch.compile(backend="ltc_cache")`` reached
that within 21 requests, and the walk (0.17 s) landed on a request's first
token. So a load ends by collecting the youngest generation (its cyclic
garbage, a few milliseconds) and moving what survives straight into the
oldest (``gc.freeze`` then ``gc.unfreeze``; not where the user froze objects
of their own, which that would thaw), uncounted, as the objects a
process makes at start-up and keeps: those loads then schedule no walk of
their own (docs/torch/dynamo.md#cyclic-gc-during-warm-loads). The young
objects of the user's that are alive at that moment move with them; a
cycle among them that dies later waits for the next walk.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["holding_off"]


@contextlib.contextmanager
def holding_off() -> Iterator[None]:
    """No cyclic collection inside the block (or, as ``@holding_off()``,
    the decorated function). Nests; a collector the user turned off stays
    off; with threads, the first block to end turns it back on (the others
    merely lose the saving)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.collect(0)
        if not gc.get_freeze_count():  # unfreezing would thaw what the user froze
            gc.freeze()
            gc.unfreeze()
        gc.enable()

