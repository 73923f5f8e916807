"""The rows of ``python -m tools.bench.fused`` and, in its child processes,
each row's model and variants (eager, the TorchScript tier, the fused tier,
Inductor): a unit of work per variant (a call, a training step, a
``generate()`` request), set up warm, timed in interleaved rounds."""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from tools.bench.compile import MODELS as TINY_MODELS
from tools.bench.compile import TRAIN_MODELS as TINY_TRAIN_MODELS

STEADY_MODELS = ("gpt2", "bert", "llama", "t5")  # tools.bench.steady's default --models
GENERATE_MODELS = ("gpt2", "llama")
PROMPT_LENGTH = 8
LABELS = ("eager", "ts", "fused", "inductor")
TITLES = {"eager": "eager", "ts": "TorchScript tier", "fused": "fused", "inductor": "Inductor"}
# LTC_CACHE_FUSE of each ltc_cache variant: the fused one as users run it; its
# libraries are stored, so nothing is queued (``fused_queued`` says otherwise).
FUSE_MODES = {"ts": "off", "fused": "background"}
WARMUP = 3  # calls after the checked one, before timing
COUNTS = ("fused_loads", "fused_refused", "fused_queued", "fused_plan_loads",
          "fused_plan_refused", "fused_plan_queued", "traces", "aot_traces",
          "program_hits", "program_captures", "program_fallbacks", "errors")


class Row(NamedTuple):
    group: str  # steady, smallgpt, tiny, suite, generate
    model: str
    mode: str  # infer, train, decode

    @property
    def name(self) -> str:
        return f"{self.group}/{self.model}/{self.mode}"

    @classmethod
    def parse(cls, name: str) -> Row:
        return cls(*name.split("/"))


def all_rows(suite: list[str], modes: list[str]) -> list[Row]:
    rows = [Row("steady", m, "infer") for m in STEADY_MODELS]
    rows.append(Row("smallgpt", "smallgpt", "train"))
    rows += [Row("tiny", m, "infer") for m in TINY_MODELS]
    rows += [Row("tiny", m, "train") for m in TINY_TRAIN_MODELS]
    rows += [Row("suite", m, mode) for m in suite for mode in modes]
    rows += [Row("generate", m, "decode") for m in GENERATE_MODELS]
    return rows


def build(row: Row) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The row's model (seed 0), positional and keyword inputs."""
    import torch

    torch.manual_seed(0)
    if row.group == "steady":
        from zoo.sized_models import build as build_steady

        model, args = build_steady(row.model, "mid")
        return model, args, {}
    if row.group == "smallgpt":
        from zoo.small_gpt import small_gpt

        model, args = small_gpt()
        return model, args, {}
    if row.group == "tiny":
        from zoo.compile_models import MODELS

        model, args = MODELS[row.model]()
        return model, args, {}
    if row.group == "suite":
        from zoo import suite_models

        model, kwargs = suite_models.build(row.model)
        return model, (), kwargs
    if row.group == "generate":
        from zoo.generate_models import build as build_generate
        from zoo.generate_models import prompt

        return build_generate(row.model), (prompt(PROMPT_LENGTH),), {}
    raise SystemExit(f"unknown row {row.name}")


def compiled(label: str, fn: Any) -> Any:
    import torch

    import ltc_cache

    if label == "eager":
        return fn
    if label == "inductor":
        return torch.compile(fn)
    return ltc_cache.compile(fn)


@contextlib.contextmanager
def fuse_mode(mode: str | None) -> Iterator[None]:
    """``LTC_CACHE_FUSE=mode`` (None: as it is) while a variant compiles
    and makes its first calls, where its cache is chosen."""
    kept = os.environ.get("LTC_CACHE_FUSE")
    if mode is not None:
        os.environ["LTC_CACHE_FUSE"] = mode
    try:
        yield
    finally:
        if kept is None:
            os.environ.pop("LTC_CACHE_FUSE", None)
        else:
            os.environ["LTC_CACHE_FUSE"] = kept


class Unit:
    """One variant's unit of work (a call, a step, a request): ``run()``
    does one, ``result()`` one whose outputs are compared with eager's,
    ``time(calls)`` the wall and CPU milliseconds of one, over ``calls``."""

    def __init__(self, run: Callable[[], Any]) -> None:
        self.run = run

    def result(self) -> list[Any]:
        raise NotImplementedError

    def time(self, calls: int) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            self.run()
        return ((time.perf_counter() - wall) * 1e3 / calls,
                (time.process_time() - cpu) * 1e3 / calls)


class Infer(Unit):
    def result(self) -> list[Any]:
        from zoo.suite_models import main_output

        return [main_output(self.run()).detach().clone()]


class Train(Unit):
    """A forward, backward and AdamW step of ``model`` called through ``fn``."""

    def __init__(self, fn: Callable[[], Any], model: Any) -> None:
        import torch

        self.fn, self.model = fn, model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        super().__init__(self.step)

    def backward(self) -> Any:
        from zoo.suite_models import loss_of

        self.optimizer.zero_grad(set_to_none=True)
        loss = loss_of(self.fn())
        loss.backward()
        return loss

    def step(self) -> None:
        self.backward()
        self.optimizer.step()

    def result(self) -> list[Any]:
        """The loss and the gradients of a step not taken (no update)."""
        import torch

        loss = self.backward().detach()
        return [loss, *(torch.zeros_like(p) if p.grad is None else p.grad.clone()
                        for p in self.model.parameters())]


class Decode(Unit):
    """One greedy ``generate()`` request; timed per decoded token (between
    the first new token, which the prompt's forward gives, and the last)."""

    def __init__(self, model: Any, prompt: Any, new_tokens: int) -> None:
        from zoo.generate_models import generation_kwargs

        self.model, self.prompt = model, prompt
        self.kwargs = generation_kwargs("static", False, new_tokens)
        super().__init__(lambda: self.request(None))

    def request(self, streamer: Any) -> list[int]:
        return self.model.generate(self.prompt, streamer=streamer, **self.kwargs)[0].tolist()

    def result(self) -> list[Any]:
        return [self.run()]

    def time(self, calls: int) -> tuple[float, float]:
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):
            def __init__(self) -> None:
                self.wall: list[float] = []
                self.cpu: list[float] = []
                self.prompt_seen = False

            def put(self, value: Any) -> None:
                if self.prompt_seen:  # the first put is the prompt
                    self.wall.append(time.perf_counter())
                    self.cpu.append(time.process_time())
                self.prompt_seen = True

            def end(self) -> None:
                pass

        walls, cpus = [], []
        for _ in range(calls):
            clock = Clock()
            self.request(clock)
            steps = len(clock.wall) - 1
            walls.append((clock.wall[-1] - clock.wall[0]) * 1e3 / steps)
            cpus.append((clock.cpu[-1] - clock.cpu[0]) * 1e3 / steps)
        return statistics.mean(walls), statistics.mean(cpus)


def make_unit(row: Row, label: str, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
              new_tokens: int) -> Unit:
    """``label``'s variant of the row, compiled (what compiles runs on its first call)."""
    if row.mode == "decode":
        model.forward = compiled(label, model.forward)
        return Decode(model, args[0], new_tokens)
    model.train(row.mode == "train")
    fn = compiled(label, model)
    if row.mode == "train":
        return Train(lambda: fn(*args, **kwargs), model)
    return Infer(lambda: fn(*args, **kwargs))


def counts() -> dict[str, int]:
    import ltc_cache

    stats = ltc_cache.stats()
    return {k: stats.get(k, 0) for k in COUNTS}


def grad_mode(row: Row) -> Any:
    import torch

    return torch.set_grad_enabled(row.mode == "train")


def set_up(row: Row, label: str, base: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
           new_tokens: int, fuse: str | None = None) -> dict[str, Any]:
    """``label``'s variant, compiled and warm: its unit, the result of its
    second call (the first of a fused region runs TorchScript too and
    returns TorchScript's outputs), the counters its set-up moved, the
    seconds it took, the per-call estimate. ``fuse``: LTC_CACHE_FUSE
    (default: the variant's own)."""
    model = build(row)[0] if row.mode == "decode" else copy.deepcopy(base)
    before, started = counts(), time.perf_counter()
    with fuse_mode(fuse or FUSE_MODES.get(label)), grad_mode(row):
        unit = make_unit(row, label, model, args, kwargs, new_tokens)
        unit.result()
        result = unit.result()
        estimate = min(unit.time(1)[0] for _ in range(WARMUP))
    after = counts()
    return {"unit": unit, "result": result, "seconds": time.perf_counter() - started,
            "estimate_ms": estimate, "counts": {k: after[k] - before[k] for k in COUNTS}}


def difference(got: list[Any], want: list[Any]) -> float:
    """The largest difference, relative to the largest magnitude of
    ``want`` (tokens: the share of the request's tokens that differ)."""
    if not got or not hasattr(got[0], "dtype"):
        tokens = got[0] if got else []
        return sum(a != b for a, b in zip(tokens, want[0], strict=False)) / max(len(want[0]), 1)
    scale = max(float(w.abs().max()) for w in want if w.numel()) or 1.0
    return max(float((g.float() - w.float()).abs().max()) for g, w in zip(got, want, strict=True)
               if w.numel()) / scale


def time_rounds(row: Row, units: dict[str, Unit], calls: dict[str, int],
                rounds: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU ms per unit of each variant over ``rounds``
    rounds, every variant once a round, each round starting one later."""
    labels = list(units)
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    with grad_mode(row):
        for round_ in range(rounds):
            shift = round_ % len(labels)
            for label in labels[shift:] + labels[:shift]:
                samples[label].append(units[label].time(calls[label]))
    return {label: {"wall_ms": statistics.median([w for w, _ in s]),
                    "cpu_ms": statistics.median([c for _, c in s])}
            for label, s in samples.items()}
