"""Render the benchmark results (benchmarks/results/*.json) into BENCHMARKS.md.

    python -m tools.render_benchmarks             # tables, machine block, pictures
    python -m tools.render_benchmarks --check     # exit 1 if a page differs from its rendering
    python -m tools.render_benchmarks --no-pictures

The pages (BENCHMARKS.md, benchmarks/tables.md) hold markers: the text
between ``<!-- table: NAME/ID -->`` and ``<!-- end -->`` (and between
``<!-- machine -->`` and ``<!-- end -->``) is rewritten from the results,
nothing else, so rendering twice gives the same pages. Every table is marked
on exactly one page. The pictures (benchmarks/*.png) need matplotlib (the
``bench`` extra); the tables and the schema check need nothing.

A results file, benchmarks/results/NAME.json, is one tool's answer to one
question, written by the tool's ``--results`` (tools/results.py) (schema 1):

    schema        1
    name          NAME, the file's stem
    title         the tables' heading
    question      what a user asks that the tables answer
    tool          the tools.<module> that measures it (tools.bench.NAME)
    command       the command line that reproduces the rows
    commit        the code measured (a hex hash; "-dirty" after it: the work
                  tree differed from that commit)
    commit_basis  "stated": the run named its commit; "recorded": the commit
                  that recorded the figures (the run did not name one)
    date          YYYY-MM-DD
    machine       cpu (lscpu's model name), cores, torch, python, threads
                  (a number, or words where it varies)
    load          the load average during the run, or what else ran
    method        what was timed, in a sentence or two
    tables        a list of {id, columns, rows}, each optionally with a
                  title, method, command, commit, commit_basis, date and load
                  of its own (they override the file's) and notes (lines
                  under the table: why a row is over its target)

A column is {key, label} with, optionally, format (a format spec for
numbers: ".2f", ".1e", "d"), suffix (after a number: " s", "x", "%"), join
(between the numbers of a list; "-" by default, a range) and bold. A row maps
each column's key to a number, a text, true or false, null, or a list of
numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from tools.benchmark_pictures import draw_pictures

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGES = (ROOT / "BENCHMARKS.md", ROOT / "benchmarks" / "tables.md")
SCHEMA = 1

# Each key of a results file, a table, a column, a machine: (its type, required).
FILE_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "schema": (int, True),
    "name": (str, True),
    "title": (str, True),
    "question": (str, True),
    "tool": (str, True),
    "command": (str, True),
    "commit": (str, True),
    "commit_basis": (str, True),
    "date": (str, True),
    "machine": (dict, True),
    "load": (str, True),
    "method": (str, True),
    "tables": (list, True),
}
TABLE_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "id": (str, True),
    "columns": (list, True),
    "rows": (list, True),
    "title": (str, False),
    "method": (str, False),
    "command": (str, False),
    "commit": (str, False),
    "commit_basis": (str, False),
    "date": (str, False),
    "load": (str, False),
    "notes": (list, False),
}
COLUMN_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "key": (str, True),
    "label": (str, True),
    "format": (str, False),
    "suffix": (str, False),
    "join": (str, False),
    "bold": (bool, False),
}
MACHINE_KEYS: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "cpu": (str, True),
    "cores": (int, True),
    "torch": (str, True),
    "python": (str, True),
    "threads": ((int, str), True),
}
COMMIT = re.compile(r"^[0-9a-f]{7,40}(-dirty)?$")
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
NUMBER = (int, float)
BLOCK = re.compile(r"(<!-- (table: [\w./-]+|machine) -->\n)(.*?)(<!-- end -->)", re.S)


def _check_keys(where: str, obj: Any, spec: dict) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: not an object"]
    errors = [f"{where}: unknown key {k!r}" for k in obj if k not in spec]
    for key, (kind, required) in spec.items():
        if key not in obj:
            errors += [f"{where}: missing {key!r}"] if required else []
        elif not isinstance(obj[key], kind) or (isinstance(obj[key], bool) and kind is not bool):
            errors.append(f"{where}: {key!r} is not {kind}")
    return errors


def _check_cell(where: str, value: Any) -> list[str]:
    if value is None or isinstance(value, (bool, str, *NUMBER)):
        return []
    if isinstance(value, list) and value and all(
            isinstance(v, NUMBER) and not isinstance(v, bool) for v in value):
        return []
    return [f"{where}: a cell is a number, text, true/false, null or a list of numbers"]


def _check_provenance(where: str, obj: dict) -> list[str]:
    errors = []
    if "commit" in obj and not COMMIT.match(obj["commit"]):
        errors.append(f"{where}: commit {obj['commit']!r} is not a hex hash")
    if "date" in obj and not DATE.match(obj["date"]):
        errors.append(f"{where}: date {obj['date']!r} is not YYYY-MM-DD")
    if obj.get("commit_basis", "stated") not in ("stated", "recorded"):
        errors.append(f"{where}: commit_basis is 'stated' or 'recorded'")
    if "command" in obj and "python -m tools." not in obj["command"]:
        errors.append(f"{where}: the command runs a tool as `python -m tools.NAME`")
    return errors


def validate(doc: Any, name: str) -> list[str]:
    """What is wrong with one results file (empty when it follows the schema)."""
    errors = _check_keys(name, doc, FILE_KEYS)
    if errors:
        return errors
    if doc["schema"] != SCHEMA:
        errors.append(f"{name}: schema {doc['schema']} (this renderer reads {SCHEMA})")
    if doc["name"] != name:
        errors.append(f"{name}: 'name' is {doc['name']!r}, not the file's stem")
    if not doc["tool"].startswith("tools."):
        errors.append(f"{name}: tool {doc['tool']!r} is not tools.<module>")
    errors += _check_provenance(name, doc)
    errors += _check_keys(f"{name}: machine", doc["machine"], MACHINE_KEYS)
    if not doc["tables"]:
        errors.append(f"{name}: no tables")
    ids = [t.get("id") for t in doc["tables"] if isinstance(t, dict)]
    if len(ids) != len(set(ids)):
        errors.append(f"{name}: two tables share an id")
    for table in doc["tables"]:
        where = f"{name}/{table.get('id') if isinstance(table, dict) else '?'}"
        table_errors = _check_keys(where, table, TABLE_KEYS)
        if table_errors:
            errors += table_errors
            continue
        errors += _check_provenance(where, table)
        for column in table["columns"]:
            errors += _check_keys(f"{where}: column", column, COLUMN_KEYS)
        keys = [c.get("key") for c in table["columns"] if isinstance(c, dict)]
        if len(keys) != len(set(keys)):
            errors.append(f"{where}: two columns share a key")
        if not table["rows"]:
            errors.append(f"{where}: no rows")
        for i, row in enumerate(table["rows"]):
            if not isinstance(row, dict) or set(row) != set(keys):
                errors.append(f"{where}: row {i} has other keys than the columns")
                continue
            for key in keys:
                errors += _check_cell(f"{where}: row {i}, {key}", row[key])
        for note in table.get("notes", []):
            if not isinstance(note, str):
                errors.append(f"{where}: a note is not text")
    return errors


def load_results(directory: Path = RESULTS) -> dict[str, dict]:
    """Every results file, by name; ValueError if one breaks the schema."""
    results, errors = {}, []
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text())
        errors += validate(doc, path.stem)
        results[path.stem] = doc
    if errors:
        raise ValueError("benchmark results break the schema:\n  " + "\n  ".join(errors))
    return results


def format_cell(value: Any, column: dict) -> str:
    """One cell's text: numbers through the column's format and suffix."""
    if value is None:
        return ""
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, NUMBER):
        text = format(value, column.get("format", "")) + column.get("suffix", "")
    elif isinstance(value, list):
        spec = column.get("format", "")
        text = column.get("join", "-").join(format(v, spec) for v in value)
        text += column.get("suffix", "")
    else:
        text = value
    return f"**{text}**" if column.get("bold") and text else text


def _provenance(doc: dict, table: dict) -> str:
    def get(key: str) -> Any:
        return table.get(key, doc[key])
    threads = doc["machine"]["threads"]
    threads = f"{threads} thread{'s' if threads != 1 else ''}" if isinstance(
        threads, int) else threads
    measured = "at" if get("commit_basis") == "stated" else "recorded at"
    return (f"**{get('title')}.** {get('method')} `{get('command')}`; {measured} "
            f"`{get('commit')}` ({get('date')}), {threads}, load {get('load')}.")


def render_table(doc: dict, table: dict) -> str:
    """A table's block: how it was measured, the table, its notes."""
    columns = table["columns"]
    lines = [_provenance(doc, table)]
    lines.append("| " + " | ".join(c["label"] for c in columns) + " |")
    lines.append("|" + "|".join("---:" if "format" in c else "---" for c in columns) + "|")
    for row in table["rows"]:
        lines.append("| " + " | ".join(format_cell(row[c["key"]], c) for c in columns) + " |")
    if table.get("notes"):
        lines.append("")
        lines += [f"- {note}" for note in table["notes"]]
    return "\n".join(lines) + "\n"


def render_machine(results: dict[str, dict]) -> str:
    """The machine block: what every file shares, and when the figures were measured."""
    machines = [doc["machine"] for doc in results.values()]
    lines = []
    for key, label in (("cpu", "CPU (`lscpu`)"), ("cores", "cores"), ("torch", "torch"),
                       ("python", "Python")):
        values = sorted({str(m[key]) for m in machines})
        lines.append(f"- {label}: {', '.join(values)}")
    counts = [m["threads"] for m in machines if isinstance(m["threads"], int)]
    usual = max(sorted(set(counts)), key=counts.count)
    lines.append(f"- intra-op threads: {usual}, unless a table says otherwise")
    dates = sorted(t.get("date", d["date"]) for d in results.values() for t in d["tables"])
    lines.append(f"- measured from {dates[0]} to {dates[-1]}; each table names its commit")
    return "\n".join(lines) + "\n"


def render_page(text: str, results: dict[str, dict]) -> tuple[str, set[str]]:
    """The page with every marked block rewritten, and the tables it holds."""
    tables = {f"{name}/{t['id']}": (doc, t) for name, doc in results.items()
              for t in doc["tables"]}
    seen: set[str] = set()

    def block(match: re.Match) -> str:
        marker = match.group(2)
        if marker == "machine":
            body = render_machine(results)
        else:
            key = marker.removeprefix("table: ")
            if key not in tables:
                raise KeyError(f"no results for the marker {marker!r}")
            if key in seen:
                raise KeyError(f"{key} is marked twice")
            seen.add(key)
            body = render_table(*tables[key])
        return match.group(1) + body + match.group(4)

    return BLOCK.sub(block, text), seen


def render_pages(results: dict[str, dict], pages: tuple[Path, ...] = PAGES) -> dict[Path, str]:
    """Every page rendered; KeyError unless each table is marked on exactly one page."""
    rendered, marked = {}, []
    for page in pages:
        rendered[page], seen = render_page(page.read_text(), results)
        marked += sorted(seen)
    every = {f"{name}/{t['id']}" for name, doc in results.items() for t in doc["tables"]}
    if sorted(marked) != sorted(every) or len(marked) != len(set(marked)):
        missing = sorted(every - set(marked))
        raise KeyError(f"tables not marked on exactly one page: {missing or marked}")
    return rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if a page differs from its rendering")
    parser.add_argument("--no-pictures", action="store_true")
    args = parser.parse_args(argv)
    results = load_results()
    rendered = render_pages(results)
    stale = [p for p, text in rendered.items() if p.read_text() != text]
    if args.check:
        for page in stale:
            print(f"{page.relative_to(ROOT)} differs from its rendering", file=sys.stderr)
        return 1 if stale else 0
    for page in stale:
        page.write_text(rendered[page])
        print(f"wrote {page.relative_to(ROOT)}")
    if not args.no_pictures:
        for path in draw_pictures(results, ROOT / "benchmarks"):
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
