"""The graphs waiting for a library, and the one background worker that
compiles them.

A process that meets a stored graph with no library (and no refusal) puts
its key in the queue, a folder of empty files named by graph key inside
the cache directory, and starts the worker unless one runs; a process
that misses starts it at its first miss already (a program's capture, a
plan's or a graph's miss), so that the compile gets ready while the
process traces (:mod:`ltc_cache.cli.fuse_worker`). The worker
removes a graph's file once it has stored the graph's fused entry: a
process waiting for the library watches for that (:mod:`.pickup`). The worker
holds a file lock, so one compiles at a time however many processes start
one; it drains the queue, lets the lock go, and looks once more before it
leaves, so a key queued while it was leaving is not stranded. A process
that starts the worker registers itself as its client: the worker
compiles while its clients are idle (:mod:`.governor`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from ...entries.wire import is_entry_key
from .governor import register_client

__all__ = ["FuseQueue", "start_worker"]

logger = logging.getLogger("ltc_cache.fused")

QUEUE_DIR = "fuse-queue"
_WORKER_LOCK = ".worker.lock"
_CLAIMS = ".claims"
WORKER_LOG = "worker.log"


class FuseQueue:
    """The queue of one cache directory."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = Path(cache_dir) / QUEUE_DIR

    def put(self, graph_key: str) -> Path:
        """Queue ``graph_key`` (queued already: left as it is); its file in
        the queue, which the worker removes once it has stored the graph's
        fused entry. Raises OSError where the directory cannot be written."""
        self.path.mkdir(mode=0o700, exist_ok=True)
        queued = self.path / graph_key
        with contextlib.suppress(FileExistsError):
            os.close(os.open(queued, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        return queued

    def pending(self) -> list[str]:
        """Queued keys, oldest first."""
        try:
            files = [(f.stat().st_mtime_ns, f.name) for f in self.path.iterdir()
                     if is_entry_key(f.name)]
        except OSError:
            return []
        return [name for _, name in sorted(files)]

    def queued(self, graph_key: str) -> bool:
        """Whether ``graph_key`` is in the queue."""
        return (self.path / graph_key).exists()

    def done(self, graph_key: str) -> None:
        with contextlib.suppress(OSError):
            (self.path / graph_key).unlink()

    def worker_running(self) -> bool:
        """Whether a worker holds the queue (one that is leaving looks once
        more at the queue after it lets go)."""
        with self.worker_lock() as free:
            return not free

    @contextlib.contextmanager
    def worker_lock(self) -> Iterator[bool]:
        """Whether this process is the worker (the lock is taken without waiting)."""
        with self.held(_WORKER_LOCK) as held:
            yield held

    @contextlib.contextmanager
    def claimed(self, job: str) -> Iterator[bool]:
        """Whether this process holds the compile of ``job`` (a graph's or
        plan part's name), taken without waiting: compiles that drain the
        queue side by side never take the same job."""
        (self.path / _CLAIMS).mkdir(mode=0o700, exist_ok=True)
        with self.held(f"{_CLAIMS}/{job}") as held:
            yield held

    @contextlib.contextmanager
    def held(self, name: str) -> Iterator[bool]:
        """Whether this process holds the lock file ``name`` of the queue,
        taken without waiting; the kernel lets it go with the process."""
        import filelock  # the worker's alone: a warm process never imports it

        self.path.mkdir(mode=0o700, exist_ok=True)
        lock = filelock.FileLock(str(self.path / name))
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            yield False
            return
        try:
            yield True
        finally:
            lock.release()


def start_worker(cache_dir: Path) -> None:
    """Start the background worker (``python -m ltc_cache.cli.fuse_worker``)
    as a process of its own session, writing to the queue's log, with this
    process's settings. Raises OSError where it cannot be started."""
    queue = FuseQueue(cache_dir)
    queue.path.mkdir(mode=0o700, exist_ok=True)
    register_client(queue.path)  # the worker compiles while this process is idle
    env = dict(os.environ, LTC_CACHE_DIR=str(cache_dir))
    # The package as this process imported it, installed or not.
    package_root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    # Through sh, which puts the worker in the background and leaves at
    # once: the worker outlives this process and is never its zombie.
    command = 'exec "$@" </dev/null >>"$LTC_CACHE_FUSE_LOG" 2>&1 &'
    env["LTC_CACHE_FUSE_LOG"] = str(queue.path / WORKER_LOG)
    subprocess.run(["/bin/sh", "-c", command, "sh", sys.executable, "-m",
                    "ltc_cache.cli.fuse_worker"], env=env, check=True,
                   stdin=subprocess.DEVNULL, start_new_session=True)
    logger.info("started the fuse worker for %s", cache_dir)
