"""The pictures of BENCHMARKS.md (benchmarks/warm_start.png, steady_state.png),
drawn from the results by ``python -m tools.render_benchmarks``; they need
matplotlib (the ``bench`` extra), imported only when drawing."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _rows(results: dict[str, dict], name: str, table: str) -> list[dict]:
    return next(t for t in results[name]["tables"] if t["id"] == table)["rows"]


def _strip(ax: Any, groups: list[tuple[str, list[float]]], color: str) -> None:
    """Points of each group on its own line, spread a little so that equal values show."""
    for y, (_, values) in enumerate(groups):
        offsets = [((i * 7) % 11 - 5) * 0.035 for i in range(len(values))]
        ax.scatter(values, [y + o for o in offsets], s=14, color=color, alpha=0.6,
                   edgecolors="none")
        middle = sorted(values)[len(values) // 2]
        ax.plot([middle, middle], [y - 0.3, y + 0.3], color="black", linewidth=1.5)
    ax.set_yticks(range(len(groups)), [label for label, _ in groups])
    ax.set_ylim(-0.6, len(groups) - 0.4)


def _log_ticks(axis: Any, ticks: list[float]) -> None:
    """Plain numbers at the given places on a log axis, and no minor labels."""
    axis.set_ticks(ticks, [f"{t:g}" for t in ticks])
    axis.set_minor_formatter(lambda *_: "")


def _draw_warm_start(plt: Any, results: dict[str, dict], path: Path) -> None:
    models = _rows(results, "warm_start", "suite8")
    suite = _rows(results, "suite", "models")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.2),
                                      gridspec_kw={"width_ratios": [1.35, 1]})
    bars = (("inductor_cold_s", "Inductor, cold", "#bbbbbb"),
            ("inductor_warm_cpu_s", "Inductor, warm (its caches on)", "#e08a3c"),
            ("ltc_warm_cpu_s", "ltc_cache, warm", "#2a6fb0"))
    height = 0.26
    for i, (key, label, color) in enumerate(bars):
        ys = [n + (1 - i) * height for n in range(len(models))]
        left.barh(ys, [m[key] for m in models], height=height, color=color, label=label)
    for n, m in enumerate(models):
        left.annotate(f"{m['ratio_cpu']:.3f}x", (m["ltc_warm_cpu_s"], n - height),
                      xytext=(4, 0), textcoords="offset points", va="center", fontsize=8)
    left.set_xscale("log")
    left.set_yticks(range(len(models)), [m["model"].replace("ForConditionalGeneration", "")
                                         .replace("ForMaskedLM", "") for m in models])
    left.invert_yaxis()
    left.set_xlabel("first training step, seconds (log scale; warm: CPU time)")
    left.set_title("Warm first step against Inductor's (label: ltc_cache / Inductor warm)",
                   fontsize=10)
    left.set_xlim(0.05, 100)
    _log_ticks(left.xaxis, [0.1, 0.3, 1, 3, 10, 30, 100])
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3, fontsize=8)
    left.grid(axis="x", which="both", alpha=0.25)
    groups = [(f"{mode} ({len(vals)} models)", vals) for mode, vals in (
        ("inference", [r["warm_vs_cold"] for r in suite if r["mode"] == "infer"]),
        ("training", [r["warm_vs_cold"] for r in suite if r["mode"] == "train"]))]
    _strip(right, groups, "#2a6fb0")
    right.axvline(1.0, color="#888888", linestyle="--", linewidth=1)
    right.text(0.95, 1.45, "cold", ha="right", fontsize=8, color="#555555")
    right.set_xscale("log")
    right.set_xlim(0.02, 1.5)
    _log_ticks(right.xaxis, [0.03, 0.05, 0.1, 0.2, 0.5, 1])
    right.set_xlabel("warm first call or step / cold (log scale; bar: median)")
    right.set_title("ltc_cache on every model of the suites: warm against cold",
                    fontsize=10)
    right.grid(axis="x", which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _draw_steady_state(plt: Any, results: dict[str, dict], path: Path) -> None:
    rows = _rows(results, "steady_state", "one_thread")
    suite = _rows(results, "suite_fused", "models")
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6),
                                      gridspec_kw={"width_ratios": [1.35, 1]})
    bars = (("eager", "eager", "#bbbbbb"), ("torchscript", "TorchScript tier", "#7fb2e0"),
            ("fused", "fused tier", "#2a6fb0"))
    height = 0.26
    for i, (key, label, color) in enumerate(bars):
        ys = [n + (i - 1) * height for n in range(len(rows))]
        left.barh(ys, [r[key] / r["inductor"] for r in rows], height=height, color=color,
                  label=label)
    left.axvline(1.0, color="#e08a3c", linewidth=1.5, label="Inductor")
    left.set_yticks(range(len(rows)), [r["row"] for r in rows], fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("time per call, step or token / Inductor's (one thread, CPU time)")
    left.set_title("Real and tiny sizes, training steps, decoding", fontsize=10)
    left.legend(loc="lower right", fontsize=8)
    left.grid(axis="x", alpha=0.25)
    groups = []
    for key, label in (("eager_ms", "eager"), ("torchscript_ms", "TorchScript tier"),
                       ("fused_ms", "fused tier")):
        for mode, name in (("infer", "inference"), ("train", "training")):
            groups.append((f"{label}, {name}",
                           [r[key] / r["inductor_ms"] for r in suite if r["mode"] == mode]))
    _strip(right, groups, "#2a6fb0")
    right.axvline(1.0, color="#e08a3c", linewidth=1.5)
    right.invert_yaxis()
    right.set_xscale("log")
    _log_ticks(right.xaxis, [0.5, 0.7, 1, 1.5, 2, 3, 5])
    right.set_xlabel("time / Inductor's (log scale; bar: median)")
    right.set_title(f"The suites' models at tiny sizes ({len(suite) // 2} models)",
                    fontsize=10)
    right.grid(axis="x", which="both", alpha=0.25)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def draw_pictures(results: dict[str, dict], directory: Path) -> list[Path]:
    """benchmarks/warm_start.png and steady_state.png, from the results (needs matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the pictures need matplotlib: pip install -e '.[bench]' "
                         "(or --no-pictures)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    written = []
    for name, draw in (("warm_start", _draw_warm_start), ("steady_state", _draw_steady_state)):
        path = directory / f"{name}.png"
        draw(plt, results, path)
        written.append(path)
    return written
