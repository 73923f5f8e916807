"""Programs of several frames (``ltc_cache.program.frames``): functions Dynamo
compiles with graph breaks, cold then warm in child processes
(``tests/children/frames.py``), against eager.

Each test writes ``framemodels.py`` and ``after.py`` (a helper called only
after the break) into its temp dir, so it can edit them between processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CHILDREN, captured_models, child_env, free_port, on_import_path

from ltc_cache.entries.entry import decode, encode
from ltc_cache.entries.wire import is_entry_key
from ltc_cache.store import DiskStore, ReadOnlyDiskStore

MODELS = '''\
import torch
import after

SCALE = 2.0


def shift(x):
    return x + 1.0


class Branchy(torch.nn.Module):
    """A data-dependent branch: Dynamo breaks the graph at the ``if``."""

    def __init__(self, width=16):
        super().__init__()
        self.first = torch.nn.Linear(width, width)
        self.second = torch.nn.Linear(width, width)

    def forward(self, x):
        y = self.first(x)
        if x.sum() > 0:
            y = y * SCALE
        else:
            y = shift(y)
        return after.act(self.second(y))


def branchy():
    return Branchy()


class Flagged(Branchy):
    """A branch on a tensor's value read with ``item()``, as Longformer's
    global attention: one graph is refused as data-dependent, not as a
    graph break."""

    def forward(self, x):
        y = self.first(x)
        flag = (x > 0).flatten().any().item()
        if flag:
            y = y * SCALE
        return after.act(self.second(y))


def flagged():
    return Flagged()
'''

AFTER = '''\
import torch


def act(x):
    return torch.tanh(x)
'''

OTHER_SHIFT = '''

def other_shift(x):
    return x - 3.0
'''

SCRIPT = Path(sys.executable).with_name("ltc-cache")


@pytest.fixture
def models(tmp_path, cache_dir, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "framemodels.py").write_text(MODELS)
    (directory / "after.py").write_text(AFTER)
    return directory


@pytest.fixture(scope="session")
def captured(tmp_path_factory) -> dict:
    """One cold process of ``branchy`` for the whole run, shared by the
    tests that start from its stored program: its report, its models
    directory (read only: the program names its files), its cache (each
    test copies it: ``stored``) and its signing key's config directory.
    ``other_shift`` is added to the models after the capture: a function
    added to a module leaves its program fresh."""

    def cold(models: Path, env: dict) -> dict:
        report = run("branchy", models, env=env)
        assert_correct(report)
        (models / "framemodels.py").write_text(MODELS + OTHER_SHIFT)
        return report

    return captured_models(tmp_path_factory, "test_frames",
                           {"framemodels.py": MODELS, "after.py": AFTER}, cold)


def run(model: str, models: Path | None = None, *args: str,
        env: dict[str, str] | None = None) -> dict:
    command = [sys.executable, str(CHILDREN / "frames.py"), model, *args]
    env = env or child_env()
    if models is not None:
        command += ["--models", str(models)]
        env = on_import_path(env, models)
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_correct(result: dict) -> None:
    assert result["losses"] == pytest.approx(result["eager"], abs=1e-5), result
    assert result["grad_error"] <= 1e-5, result
    assert result["stats"]["errors"] == 0, result
    assert result["stats"].get("program_fallbacks", 0) == 0, result
    assert not result["warnings"], result["warnings"]


def assert_warm(result: dict) -> None:
    """Loaded: no Dynamo frame, no AOTAutograd trace, no LTC trace."""
    assert_correct(result)
    assert result["frames_ok"] == 0, result
    assert result["aot_traces"] == 0, result
    assert result["stats"]["traces"] == 0, result
    assert result["stats"].get("program_hits", 0) == 1, result
    assert result["stats"].get("program_captures", 0) == 0, result


def frame_programs(directory: Path) -> list:
    store = ReadOnlyDiskStore(directory)
    try:
        entries = [decode(store.peek(k)) for k in list(store.keys()) if is_entry_key(k)]
        return [e for e in entries if e.kind == "program" and "frames" in e.payload]
    finally:
        store.close()


@pytest.mark.slow  # child processes
def test_a_data_dependent_break_is_stored_and_loaded_warm(stored, cache_dir):
    models, cold = stored
    assert cold["stats"]["program_captures"] == 1, cold
    assert cold["frames_ok"] > 0, cold
    # One INFO line for the function, with Dynamo's reason.
    lines = [line for line in cold["logs"] if "frames" in line]
    assert len(lines) == 1 and "Data-dependent branching" in lines[0], cold["logs"]
    (program,) = frame_programs(cache_dir)
    codes = program.payload["frames"]["codes"]
    assert codes[0][0] == "Branchy.forward", codes
    # Both ways through the branch: the forward cut at the if, and a resume
    # function for each way on.
    assert sum(code[3] for code in codes) >= 3, codes
    assert all(isinstance(c, list) and len(c) == 3 for c in program.payload["checks"])

    warm = run("branchy", models)
    assert_warm(warm)
    assert any("loaded program" in line and "Data-dependent" in line
               for line in warm["logs"]), warm["logs"]
    assert warm["losses"] == cold["losses"]

    # ltc-cache show lists the frames.
    shown = subprocess.run([str(SCRIPT), "--dir", str(cache_dir), "show", program.key[:12]],
                           capture_output=True, text=True, check=True).stdout
    assert "Frames" in shown and "Branchy.forward" in shown and "resume" in shown, shown


@pytest.mark.slow
def test_gpt2_training_is_warm(cache_dir, tmp_path, monkeypatch):
    """GPT-2's loss logs a once-only warning: a graph break, unless the
    capture skips the logger's ``*_once`` methods (as ``precompile`` does);
    either way one stored program serves the next process."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    cold = run("gpt2")
    assert_correct(cold)
    assert any("stored program" in line for line in cold["logs"]), cold["logs"]
    warm = run("gpt2")
    assert_warm(warm)
    assert warm["losses"] == cold["losses"]


def test_a_branch_on_an_item_is_a_graph_break_to_dynamo(dynamo_reset):
    """Under ``fullgraph=True`` a branch on ``item()`` is a ``UserError``
    raised while handling ``GuardOnDataDependentSymNode``; ltc_cache takes
    it for a graph break (docs/torch/dynamo.md#item-branch-is-not-a-graph-break)."""
    from ltc_cache.program.frames import breaks_the_graph

    def flagged(x):
        if (x > 0).flatten().any().item():
            return x * 2
        return x + 1

    with pytest.raises(torch._dynamo.exc.UserError) as raised:
        torch.compile(flagged, fullgraph=True, dynamic=False, backend="eager")(torch.ones(3))
    assert breaks_the_graph(raised.value), repr(raised.value)
    assert not breaks_the_graph(RuntimeError("something else"))


@pytest.mark.slow  # two child processes
def test_a_branch_on_an_item_is_stored_as_frames_and_loaded_warm(models, cache_dir):
    """Longformer's pattern: it went to torch.compile on every start."""
    cold = run("flagged", models)
    assert_correct(cold)
    assert cold["stats"]["program_captures"] == 1, cold
    assert cold["stats"].get("program_fallbacks", 0) == 0, cold
    assert len(frame_programs(cache_dir)) == 1
    assert_warm(run("flagged", models))


@pytest.mark.slow
def test_an_edited_function_after_the_break_never_runs_stale(models, cache_dir):
    assert_correct(run("branchy", models))
    # Only the resume function calls after.act.
    (models / "after.py").write_text(AFTER.replace("torch.tanh(x)", "torch.sigmoid(x)"))
    edited = run("branchy", models)
    assert_correct(edited)  # against eager with the edited helper
    assert edited["stats"]["program_captures"] == 1, edited
    assert any("stale" in line and "changed" in line for line in edited["logs"]), \
        edited["logs"]
    assert_warm(run("branchy", models))


@pytest.mark.slow
def test_a_rebound_global_after_the_break_captures_that_frame_alone(stored):
    models, _ = stored
    # shift (reached only on the else branch, after the break) is another
    # function in this process (other_shift, added to the module after the
    # capture): the frame that inlined it fails its portable check, and
    # Dynamo captures that frame again; the others load.
    result = run("branchy", models, "--set", "shift=other_shift")
    assert_correct(result)
    assert result["stats"].get("program_hits", 0) == 1, result
    assert result["stats"].get("program_captures", 0) == 0, result
    assert 1 <= result["frames_ok"] <= 2, result  # not the whole function again
    assert any("does not fit" in line for line in result["logs"]), result["logs"]


class Payload:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.slow
@pytest.mark.parametrize("process", ["cold", "warm"])
def test_a_global_rebound_between_steps_is_seen(request, process):
    """The frame that inlined ``shift`` carries its portable check in the
    capturing process too (its live entry), and after a load."""
    if process == "warm":
        models, _ = request.getfixturevalue("stored")
    else:
        models = request.getfixturevalue("models")
        (models / "framemodels.py").write_text(MODELS + OTHER_SHIFT)
    # Steps 0 and 2 take the SCALE branch, 1 and 3 shift's: rebound at 3.
    result = run("branchy", models, "--steps", "4", "--set", "shift=other_shift",
                 "--set-at", "3")
    assert_correct(result)  # eager rebinds too: the same losses
    if process == "warm":
        assert result["stats"].get("program_hits", 0) == 1, result


@pytest.mark.slow  # child processes
def test_a_poisoned_frame_never_runs(stored, cache_dir, tmp_path):
    """A frames program poisoned in turn in its artifact (the frames'
    bytecode and graphs swapped for a payload) and in its checks (one
    dropped, so a frame would run unchecked): each next process refuses it
    with one warning, captures and stores a good one, which the last loads."""
    models, _ = stored
    marker = tmp_path / "PAYLOAD_RAN"
    for part in ("artifact", "checks"):
        (program,) = frame_programs(cache_dir)
        payload = dict(program.payload)
        if part == "artifact":
            payload["artifact"] = pickle.dumps(Payload(str(marker)))
        else:
            payload["checks"] = payload["checks"][1:]
        store = DiskStore(cache_dir)
        try:
            store.put(program.key, encode(dataclasses.replace(program, payload=payload)))
        finally:
            store.close()
        warm = run("branchy", models)
        assert not marker.exists(), "a poisoned frame was unpickled"
        assert warm["losses"] == pytest.approx(warm["eager"], abs=1e-5), (part, warm)
        # Refused with one warning (counted as a bad entry), captured, stored again.
        assert warm["stats"]["errors"] == 1, (part, warm)
        assert any("signature" in w for w in warm["warnings"]), (part, warm)
        assert warm["stats"]["program_captures"] == 1, (part, warm)
    assert_warm(run("branchy", models))


def test_frames_entries_are_signed_with_their_frames(tmp_path):
    from ltc_cache.entries.keys import CacheKey
    from ltc_cache.errors import EntryError
    from ltc_cache.program.program_entries import program_entry, program_parts

    key = CacheKey("ab" * 32, {"inputs": "x"})
    secret = b"k" * 32
    frames = {"codes": [["f", "m.py", 1, 1]], "breaks": [["why", 1]], "skips": []}
    entry = program_entry(key, "f.program", sources=[], checks=[[0, 0, []]], globals_=[],
                          artifact=b"data", secret=secret, node_count=1, frames=frames)
    assert program_parts(decode(encode(entry)), secret).frames == frames
    for change in ({"frames": {**frames, "codes": []}}, {"frames": None}):
        forged = decode(encode(entry))
        payload = {**forged.payload, **change}
        if change.get("frames", 0) is None:
            payload.pop("frames")
        forged = type(forged)(forged.key, forged.ir, forged.inputs, forged.outputs,
                              forged.updates, forged.meta, kind=forged.kind, payload=payload)
        with pytest.raises(EntryError, match="signature"):
            program_parts(forged, secret)


def test_names_after_a_load_do_not_collide(dynamo_reset):
    """A recompile after a load picks names past the installed ones."""
    from torch._dynamo.bytecode_transformation import unique_id

    from ltc_cache.program.frames.code_lookup import advance_unique_ids

    scope = {"__resume_at_60_4000": None, "__builtins_dict___4001": {}}
    advance_unique_ids(scope)
    assert int(unique_id("__builtins_dict__").rsplit("_", 1)[1]) > 4001


# --- data-parallel training (torchrun, 2 ranks) ------------------------------------


def torchrun(order: str, out: Path, port: int) -> list[dict]:
    for old in out.glob("rank*.json"):
        old.unlink()
    command = [str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node=2",
               f"--master_port={port}", str(CHILDREN / "ddp.py"), order, str(out)]
    if order != "torch_compile_ddp":  # (whose DDPOptimizer asserts a cap of 1 MiB or more)
        command += ["--bucket-mb", "0.04"]  # GPT-2's 118 KB of weights: three buckets
    proc = subprocess.run(command, capture_output=True, text=True, env=child_env(),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


def graph_entries(directory: Path) -> int:
    store = ReadOnlyDiskStore(directory)
    try:
        return sum(1 for k in list(store.keys())
                   if is_entry_key(k) and decode(store.peek(k)).kind == "graph")
    finally:
        store.close()


def assert_cut_at_buckets(order: str, rank: dict) -> None:
    """The program's graph is cut at DDP's three buckets, each piece's
    backward its own autograd node, which hands DDP its gradients as it
    ends (torch.compile's graphs are Dynamo's DDPOptimizer's to cut)."""
    if order == "torch_compile_ddp":
        return
    cuts = [line for line in rank["logs"] if "DDP's gradient buckets" in line]
    assert cuts == ["GPT2LMHeadModel: cut into 3 pieces at DDP's gradient buckets"], rank["logs"]
    assert rank["compiled_nodes"] == ["_JointBackward"] * 3, rank


@pytest.mark.slow  # two torchrun launches of two ranks each
@pytest.mark.parametrize("order", ["ddp_of_compiled", "compiled_ddp", "torch_compile_ddp"])
def test_ddp_ranks_cold_then_warm(order, cache_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    out = tmp_path / "out"
    out.mkdir()
    cold = torchrun(order, out, free_port())  # (tests run side by side)
    reference = cold[0]["reference"]
    for rank in cold:
        assert rank["losses"] == pytest.approx(reference, abs=1e-5), rank
        assert rank["stats"]["errors"] == 0, rank
        assert_cut_at_buckets(order, rank)
    # Across ranks each LTC graph is traced once (the other rank waits, then hits).
    assert sum(rank["stats"]["traces"] for rank in cold) == graph_entries(cache_dir) > 0

    warm = torchrun(order, out, free_port())
    for rank in warm:
        assert rank["losses"] == pytest.approx(reference, abs=1e-5), rank
        assert_cut_at_buckets(order, rank)
        assert rank["aot_traces"] == 0, rank
        assert rank["stats"]["traces"] == 0, rank
        if order == "torch_compile_ddp":
            # torch.compile's own wrapper: Dynamo captures in every process
            # (README: write ltc_cache.compile instead).
            continue
        assert rank["stats"].get("program_hits", 0) == 1, rank
        assert rank["stats"].get("program_captures", 0) == 0, rank
        # No capture; at most a visit of a frame Dynamo runs as it is.
        assert rank["captures"] == 0, rank
        assert rank["frames_ok"] <= 1, rank["visited"]
    if order == "torch_compile_ddp":
        assert all(rank["captures"] > 0 for rank in warm), warm
