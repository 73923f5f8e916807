"""Writing a tool's measured tables into its results file
(benchmarks/results/NAME.json, the schema in tools/render_benchmarks.py).

A tool that answers a results file's question takes ``--results`` (and
``--results-dir DIR``, to write a scratch copy instead); at the start of
its run it makes a :class:`Recorder`, which notes the command line and the
load average, and at the end hands it the tables it measured. The
recorder collects what the file says of the run itself: the machine
(``lscpu``'s model name, the cores, torch, Python, the threads), the
commit (with ``-dirty`` where the work tree differs from it), today's date
and the load average from start to end.

Writing a table replaces the table of the same id and keeps the file's
others, so each tool run refreshes its own rows. Where a tool measures
some of a table's rows (a subset of its models), it names the columns
that identify a row (``merge_on``) and the rows it did not measure stay.
A table written without columns takes the ones the file has (their
labels and formats are the page's); its title, method and notes stay
unless the tool gives new ones. The file is checked against the render
script's schema before it is written; the pages change only when
``python -m tools.render_benchmarks`` runs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tools import render_benchmarks as render

# What a run names of itself; a table that carries them overrides the file's.
PROVENANCE = ("command", "commit", "commit_basis", "date", "load")


def add_arguments(parser: argparse.ArgumentParser, *names: str) -> None:
    """``--results`` (write the measured rows into NAME.json) and ``--results-dir``."""
    files = " or ".join(f"benchmarks/results/{name}.json" for name in names)
    parser.add_argument("--results", action="store_true",
                        help=f"write the measured rows into {files} "
                             "(then run python -m tools.render_benchmarks)")
    parser.add_argument("--results-dir", type=Path, default=render.RESULTS, metavar="DIR",
                        help="where --results writes (default benchmarks/results; "
                             "a scratch directory keeps the committed figures)")


def cpu_model() -> str:
    """``lscpu``'s model name, family and model (the platform's processor
    where there is no lscpu), and the vector features the fused tier reads
    (``AMD EPYC (family 23, model 49; avx2)``): CPUs that one name covers
    differ in them, and a library's speed with them."""
    from ltc_cache.graph.fused.cpu_isa import FEATURES, cpu_features

    features = " ".join(f for f in FEATURES if f in cpu_features()) or "no AVX2"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return f"{platform.processor() or platform.machine()} ({features})"
    fields = {key.strip(): value.strip() for key, _, value in
              (line.partition(":") for line in out.splitlines())}
    name = fields.get("Model name", platform.machine())
    if "CPU family" in fields and "Model" in fields:
        return f"{name} (family {fields['CPU family']}, model {fields['Model']}; {features})"
    return f"{name} ({features})"


def commit() -> str:
    """HEAD's short hash, ``-dirty`` where tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=render.ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD")
    return head + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def command_line(tool: str, argv: Sequence[str], prefix: str = "") -> str:
    """``python -m TOOL ...`` (``tools.bench.NAME``) as ``argv`` (the arguments) ran it, less
    the results options, which say where the rows went, not what was measured."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--results":
            continue
        elif arg == "--results-dir":
            skip = True
        elif not arg.startswith("--results-dir="):
            kept.append(arg)
    line = " ".join(["python", "-m", tool, *map(shlex.quote, kept)])
    return f"{prefix} {line}" if prefix else line


def machine(threads: int | str | None = None) -> dict[str, Any]:
    """The machine block: CPU, cores, torch, Python and the threads (torch's
    intra-op count where the tool does not say otherwise)."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count() or 1, "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads() if threads is None else threads}


def _load_text(start: float, end: float) -> str:
    low, high = sorted((round(start, 1), round(end, 1)))
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


class Recorder:
    """One tool run: made at its start, :meth:`write` at its end."""

    def __init__(self, tool: str, argv: Sequence[str] | None = None,
                 directory: Path = render.RESULTS, prefix: str = "") -> None:
        self.tool = tool
        self.command = command_line(tool, sys.argv[1:] if argv is None else argv, prefix)
        self.directory = Path(directory)
        self.load_start = os.getloadavg()[0]

    @classmethod
    def from_args(cls, tool: str, args: argparse.Namespace,
                  argv: Sequence[str] | None = None, prefix: str = "") -> Recorder | None:
        """A recorder where ``args.results`` asks for one, else None."""
        return cls(tool, argv, args.results_dir, prefix) if args.results else None

    def provenance(self) -> dict[str, str]:
        return {"command": self.command, "commit": commit(), "commit_basis": "stated",
                "date": datetime.date.today().isoformat(),
                "load": _load_text(self.load_start, os.getloadavg()[0])}

    def write(self, name: str, tables: list[dict], *, threads: int | str | None = None,
              merge_on: dict[str, Sequence[str]] | None = None,
              describe: dict[str, str] | None = None,
              derive: Callable[[dict], list[dict]] | None = None) -> Path:
        """Put ``tables`` (each ``{id, rows}``, optionally ``columns``,
        ``notes``, ``title``, ``method``) into ``NAME.json``; ``merge_on``
        maps a table id to the columns naming a row, where the run measured
        some of its rows. ``describe`` gives a new file's title, question
        and method. ``derive`` computes more tables from the merged file (a
        summary over every row, those kept included). ValueError, and
        nothing written, if the file would break the schema."""
        path = self.directory / f"{name}.json"
        old = json.loads(path.read_text()) if path.exists() else None
        provenance, block = self.provenance(), machine(threads)
        doc = merge(old, name, self.tool, tables, provenance, block, merge_on or {},
                    describe or {})
        if derive is not None:
            more = derive(doc)
            doc = merge(doc, name, self.tool, more, provenance, block, {}, {})
            tables = tables + more
        errors = render.validate(doc, name)
        if errors:
            raise ValueError(f"{path}: the results would break the schema:\n  "
                             + "\n  ".join(errors))
        self.directory.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(doc))
        for table in doc["tables"]:
            given = next((t for t in tables if t["id"] == table["id"]), None)
            if given is not None and "notes" not in given and table.get("notes"):
                print(f"{name}/{table['id']}: its notes are an earlier run's words; "
                      "check that they still hold")
        print(f"wrote {', '.join(t['id'] for t in tables)} into {path}; "
              "render with python -m tools.render_benchmarks")
        return path


def _row_key(row: dict, columns: Sequence[str]) -> tuple:
    return tuple(json.dumps(row.get(c)) for c in columns)


def _new_table(old: dict | None, given: dict, provenance: dict[str, str],
               merge_on: Sequence[str] | None, like: list[dict] | None = None) -> dict:
    table = {k: v for k, v in (old or {}).items() if k not in PROVENANCE}
    table.update({k: v for k, v in given.items() if v is not None})
    if "columns" not in table and like is not None:
        table["columns"] = like
    if "columns" not in table:
        raise ValueError(f"table {given['id']!r} is new: the tool gives its columns")
    rows = list(given["rows"])
    if merge_on and old:
        measured = {_row_key(r, merge_on) for r in rows}
        kept = [r for r in old["rows"] if _row_key(r, merge_on) not in measured]
        if kept:
            # Rows this run did not measure keep their figures; the table says
            # where they came from.
            table["load"] = (f"{provenance['load']}; {len(kept)} other rows from "
                             f"`{old['commit']}` ({old['date']})")
        by_key = {_row_key(r, merge_on): r for r in rows}
        rows = [by_key.pop(_row_key(r, merge_on), r) for r in old["rows"]] + list(
            by_key.values())
    table["rows"] = rows
    return table


def _columns_like(tables: list[dict], given: dict) -> list[dict] | None:
    """The columns of a table of the file whose keys are the given rows'
    (a new model's table takes its sibling's labels and formats)."""
    keys = set(given["rows"][0]) if given["rows"] else set()
    return next((t["columns"] for t in tables
                 if {c["key"] for c in t["columns"]} == keys), None)


def merge(old: dict | None, name: str, tool: str, tables: list[dict],
          provenance: dict[str, str], machine_block: dict[str, Any],
          merge_on: dict[str, Sequence[str]], describe: dict[str, str]) -> dict:
    """The results file ``old`` with ``tables`` written in: the run's
    provenance becomes the file's, the kept tables carry their own."""
    if old is None:
        missing = {"title", "question", "method"} - set(describe)
        if missing:
            raise ValueError(f"{name}.json is new: describe its {sorted(missing)}")
        old = {"schema": render.SCHEMA, "name": name, "title": describe["title"],
               "question": describe["question"], "tool": tool, **provenance,
               "machine": machine_block, "method": describe["method"], "tables": []}
    doc = {**old, **{k: v for k, v in describe.items() if k != "tables"}}
    written = {t["id"] for t in tables}
    olds = {t["id"]: t for t in old["tables"]}
    out = []
    for table in old["tables"]:
        if table["id"] in written:
            continue
        # A kept table was measured by an earlier run: it names that run's
        # provenance itself (where it differs) before the file's becomes this run's.
        kept = {k: v for k, v in table.items() if k not in PROVENANCE}
        kept.update({k: table.get(k, old[k]) for k in PROVENANCE
                     if table.get(k, old[k]) != provenance[k]})
        out.append(kept)
    for given in tables:
        prior = olds.get(given["id"])
        if prior is not None:
            prior = {**prior, **{k: prior.get(k, old[k]) for k in PROVENANCE}}
        out.append(_new_table(prior, given, provenance, merge_on.get(given["id"]),
                              _columns_like(old["tables"], given)))
    order = [t["id"] for t in old["tables"]] + [t["id"] for t in tables
                                                 if t["id"] not in olds]
    out.sort(key=lambda t: order.index(t["id"]))
    doc.update(provenance)
    doc["tool"] = tool
    doc["machine"] = machine_block
    doc["tables"] = out
    return doc


def dumps(doc: dict) -> str:
    """The file's text, laid out as the committed ones are: one line for the
    machine, each column and each row, so that a refresh diffs row by row."""
    def one(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    lines = ["{"]
    keys = [k for k in doc if k != "tables"]
    for key in keys:
        lines.append(f"  {one(key)}: {one(doc[key])},")
    lines.append('  "tables": [')
    for i, table in enumerate(doc["tables"]):
        lines.append("    {")
        fields = list(table)
        for j, key in enumerate(fields):
            end = "," if j < len(fields) - 1 else ""
            value = table[key]
            if key in ("columns", "rows", "notes") and value:
                lines.append(f"      {one(key)}: [")
                lines += [f"        {one(v)}" + ("," if n < len(value) - 1 else "")
                          for n, v in enumerate(value)]
                lines.append(f"      ]{end}")
            else:
                lines.append(f"      {one(key)}: {one(value)}{end}")
        lines.append("    }" + ("," if i < len(doc["tables"]) - 1 else ""))
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def rounded(value: float | None, digits: int = 2, scale: float = 1.0) -> float | None:
    """``value * scale`` to ``digits`` places, as a cell holds it (None stays None)."""
    return None if value is None else round(value * scale, digits)


def two_figures(value: float | None) -> float | None:
    """``value`` to two significant figures (an error, a ratio near zero)."""
    return None if value is None else float(f"{value:.1e}")


def numbers(values: Sequence[float | None], digits: int | None = None) -> list | None:
    """A list cell (ints where ``digits`` is None), or None where one is missing."""
    if any(v is None for v in values):
        return None
    return [round(v) if digits is None else round(v, digits) for v in values]
