"""The background worker: ``python -m ltc_cache.cli.fuse_worker``.

Started by a process that queued graphs or plans
(:mod:`ltc_cache.graph.fused.queue`); compiles their libraries one
at a time at the lowest CPU priority the system has (``SCHED_IDLE`` on
Linux: it runs only on a core nothing else wants), so a training job
beside it loses as little as can be. Its log is ``fuse-queue/worker.log``
in the cache directory.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

__all__ = ["main"]


def lower_priority() -> None:
    """Run only where the CPU is otherwise idle (g++, a child, inherits it)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        with contextlib.suppress(OSError):
            os.nice(19)


def main() -> int:
    lower_priority()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fuse worker %(process)d: "
                        "%(message)s")
    from ..compile_backend.plan_library import fuse_stored
    from ..config import CacheConfig
    from ..graph.cache import GraphCache
    from ..graph.fused.queue import FuseQueue

    config = CacheConfig.from_env()
    cache = GraphCache(config)
    queue = FuseQueue(config.directory)
    while True:
        with queue.worker_lock() as held:
            if not held:
                return 0  # another worker drains the queue
            while keys := queue.pending():
                for key in keys:
                    fuse_stored(cache, key, timeout=config.fuse_timeout)
                    queue.done(key)
        if not queue.pending():
            return 0


if __name__ == "__main__":
    sys.exit(main())
