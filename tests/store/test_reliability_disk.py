"""A full disk and a read-only directory: the model runs, with one warning,
and what is stored stays usable. LTC_CACHE_READONLY serves hits and writes
nothing.

The real cases mount a small tmpfs or a read-only bind mount inside a
private mount namespace (``unshare -m``: the mounts vanish with the child
and nothing outside sees them); they are skipped where that is not allowed.
Permission bits cannot make a directory read-only here, since the tests run
as root, so the other cases inject the errors a full or read-only medium
raises (ENOSPC, SQLITE_FULL, SQLITE_READONLY) into the store's write path.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import diskcache
import pytest
from helpers import (
    RELIABILITY_CHILD,
    cache_env,
    delta,
    matches_eager,
    recorded_warnings,
    snapshot,
)

import ltc_cache
from ltc_cache import CacheConfig, GraphCache
from ltc_cache.store import DiskStore
from zoo.reliability_models import build

NAMES = ["mlp1", "mlp2", "scaled", "deep", "mlp2-wide", "mlp2-batch3"]
# Stored first (one of them in a value file of its own), then one more.
STORED, MISSING = ["mlp1", "scaled", "deep"], "mlp2"


def _in_namespace(mount: str, directory: Path, *commands: list[str]) -> list[dict]:
    """Run ``mount`` (sh, ``$1`` is ``directory``) in a private mount
    namespace, then each command (argv after the workers script); the JSON
    report of each."""
    script = " && ".join([mount, *(f'"$2" "$3" {" ".join(c)}' for c in commands)])
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, "sh", str(directory),
                           sys.executable, str(RELIABILITY_CHILD)],
                          capture_output=True, text=True, timeout=600,
                          env=cache_env(directory / "cache"))
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def mount_namespaces(tmp_path_factory) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here")
    probe = tmp_path_factory.mktemp("probe")
    proc = subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs "$1"', "sh",
                           str(probe)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount in a private namespace here: {proc.stderr.strip()}")


def _clean(report: dict) -> None:
    assert report["failures"] == {} and report["wrong"] == []


@pytest.mark.slow  # a real tmpfs, models in child processes
def test_real_full_disk(mount_namespaces, tmp_path):
    """A 384 KiB tmpfs: the first entries fit, the rest do not. The first
    process stores what fits and warns once; the next one, which cannot
    even open the cache for writing, serves what was stored."""
    first, second = _in_namespace('mount -t tmpfs -o size=384k,mode=0700 tmpfs "$1"',
                                  tmp_path, ["run-models", *NAMES], ["run-models", *NAMES])
    for report in (first, second):
        _clean(report)
        assert len(report["warnings"]) == 1, report["warnings"]
    assert "cannot write" in first["warnings"][0]
    assert 0 < first["stats"]["stores"] < len(NAMES)
    assert second["stats"]["hits"] == first["stats"]["stores"]
    assert second["stats"]["traces"] == len(NAMES) - first["stats"]["stores"]


@pytest.mark.slow  # a real bind mount, models in child processes
def test_real_read_only_mount(mount_namespaces, tmp_path):
    """A cache on a read-only bind mount, written before it was mounted so:
    a process without LTC_CACHE_READONLY warns once and serves it; with it,
    says nothing. Neither changes a byte."""
    subprocess.run([sys.executable, str(RELIABILITY_CHILD), "run-models", *STORED], check=True,
                   env=cache_env(tmp_path / "cache"), capture_output=True, timeout=600)
    before = snapshot(tmp_path / "cache")
    mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"'
    plain, readonly = _in_namespace(mount, tmp_path, ["run-models", *STORED, MISSING],
                                    ["run-models-readonly", *STORED, MISSING])
    for report in (plain, readonly):
        _clean(report)
        assert (report["stats"]["hits"], report["stats"]["traces"]) == (3, 1)
        assert report["stats"]["stores"] == 0
    assert len(plain["warnings"]) == 1 and "using the entries in it" in plain["warnings"][0]
    assert readonly["warnings"] == []
    assert snapshot(tmp_path / "cache") == before


def _run(directory: Path, names: list[str], **config) -> tuple[dict[str, int], list[str]]:
    before = ltc_cache.stats()
    cache = GraphCache(CacheConfig(directory=directory, **config))
    with recorded_warnings() as messages:
        for name in names:
            gm, inputs = build(name)
            assert matches_eager(gm, cache.extract_compiled_graph(gm, inputs), inputs)
    return delta(before), messages


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_injected_enospc_on_every_write(tmp_path, monkeypatch):
    """Every write fails as on a full disk: value files (ENOSPC half way),
    SQLite rows (SQLITE_FULL). All models run, one warning, no value file
    left behind."""
    def half_then_full(self, full_path, iterator, mode, encoding=None):
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        with open(full_path, mode) as f:
            f.write(b"\0" * 4096)
        _no_space()

    def sqlite_full(*args):
        raise sqlite3.OperationalError("database or disk is full")

    DiskStore(tmp_path / "cache").close()  # an existing cache, on a disk that then fills
    monkeypatch.setattr(diskcache.Disk, "_write", half_then_full)
    monkeypatch.setattr(diskcache.Cache, "_row_insert", sqlite_full)
    delta, messages = _run(tmp_path / "cache", NAMES)
    assert (delta["traces"], delta["stores"]) == (len(NAMES), 0)
    assert len(messages) == 1 and "cannot write the cache" in messages[0]
    assert list((tmp_path / "cache" / "entries").rglob("*.val")) == []


def test_hits_survive_a_disk_that_filled_after_they_were_stored(tmp_path, monkeypatch):
    """diskcache's least-recently-used policy writes each get's access time;
    when that write fails (full disk, read-only database) the entry is
    still served."""
    _run(tmp_path / "cache", NAMES[:3])

    def no_transaction(self, retry=False, filename=None):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(diskcache.Cache, "_transact", no_transaction)
    delta, messages = _run(tmp_path / "cache", NAMES[:3])
    assert (delta["hits"], delta["traces"], messages) == (3, 0, [])


def test_injected_read_only_directory(tmp_path, monkeypatch):
    """Where diskcache cannot open the directory for writing (SQLITE_READONLY
    injected into its first write; the directory reads as not writable),
    the entries in it are served, with one warning."""
    _run(tmp_path / "cache", NAMES[:2])
    real_access = os.access

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and Path(path) == tmp_path / "cache":
            return False
        return real_access(path, mode, *args, **kwargs)

    def read_only(self, *args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(diskcache.Cache, "__init__", read_only)
    delta, messages = _run(tmp_path / "cache", NAMES[:3])
    assert (delta["hits"], delta["traces"], delta["stores"]) == (2, 1, 0)
    assert len(messages) == 1 and "using the entries in it" in messages[0]


@pytest.mark.slow  # a child process fills the directory
def test_readonly_flag_serves_hits_and_writes_nothing(tmp_path):
    """LTC_CACHE_READONLY=1 on a writable directory: hits are served, a miss
    is traced and not stored, and every file is byte for byte as it was."""
    # Written by another process, which has closed everything when it ends.
    subprocess.run([sys.executable, str(RELIABILITY_CHILD), "run-models", *STORED], check=True,
                   env=cache_env(tmp_path / "cache"), capture_output=True, timeout=600)
    before = snapshot(tmp_path / "cache")
    assert any(name.endswith(".val") for name in before)  # "deep" is a value file
    delta, messages = _run(tmp_path / "cache", [*STORED, MISSING], readonly=True)
    assert (delta["hits"], delta["traces"], delta["stores"], messages) == (3, 1, 0, [])
    assert snapshot(tmp_path / "cache") == before


def test_readonly_flag_on_a_missing_directory(tmp_path):
    delta, messages = _run(tmp_path / "nothing", NAMES[:1], readonly=True)
    assert delta["traces"] == 1 and len(messages) == 1
    assert not (tmp_path / "nothing").exists()
