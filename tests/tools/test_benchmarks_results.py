"""tools/results.py writes results files the render script reads: a tool
run replaces its own tables (or its own rows of one) and keeps the rest.

No benchmark runs here: the tables are made up, the directory a tmp one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import render_benchmarks as render
from tools import results

ROOT = Path(__file__).resolve().parents[2]


DESCRIBE = {"title": "A made-up question", "question": "Does the writer write?",
            "method": "Nothing measured."}
COLUMNS = [{"key": "model", "label": "model"},
           {"key": "warm_s", "label": "warm", "format": ".2f", "suffix": " s"}]


def recorder(directory: Path, *args: str) -> results.Recorder:
    return results.Recorder("tools.bench.made_up", ["--fast", *args], directory)


def test_a_new_file_follows_the_schema_and_names_its_run(tmp_path):
    path = recorder(tmp_path, "--results", "--results-dir", str(tmp_path)).write(
        "made_up", [{"id": "a", "columns": COLUMNS,
                     "rows": [{"model": "gpt2", "warm_s": 0.5}]}],
        threads=1, describe=DESCRIBE)
    doc = json.loads(path.read_text())
    assert render.validate(doc, "made_up") == []
    assert doc["command"] == "python -m tools.bench.made_up --fast"
    assert doc["commit_basis"] == "stated" and render.COMMIT.match(doc["commit"])
    assert render.DATE.match(doc["date"]) and doc["machine"]["threads"] == 1
    assert doc["machine"]["cores"] >= 1 and doc["machine"]["cpu"]
    assert path.read_text() == results.dumps(doc)


def test_writing_a_table_replaces_it_and_keeps_the_others(tmp_path):
    first = recorder(tmp_path)
    first.write("made_up", [{"id": "a", "columns": COLUMNS,
                             "rows": [{"model": "gpt2", "warm_s": 0.5}]},
                            {"id": "b", "columns": COLUMNS,
                             "rows": [{"model": "bert", "warm_s": 0.7}]}],
                threads=1, describe=DESCRIBE)
    # An earlier run's provenance, as a committed file has it.
    path = tmp_path / "made_up.json"
    doc = json.loads(path.read_text())
    doc.update(commit="abc1234", date="2026-01-02", command="python -m tools.bench.made_up")
    doc["tables"][1]["notes"] = ["a note"]
    path.write_text(results.dumps(doc))

    recorder(tmp_path, "--only-b").write(
        "made_up", [{"id": "b", "rows": [{"model": "bert", "warm_s": 0.25}]}], threads=1)
    doc = json.loads(path.read_text())
    assert render.validate(doc, "made_up") == []
    a, b = doc["tables"]
    assert a["id"] == "a" and a["rows"] == [{"model": "gpt2", "warm_s": 0.5}]
    # The kept table names the run that measured it; the file names this one.
    assert a["commit"] == "abc1234" and a["date"] == "2026-01-02"
    assert doc["command"] == "python -m tools.bench.made_up --fast --only-b"
    assert doc["commit"] != "abc1234"
    assert b["columns"] == COLUMNS and b["notes"] == ["a note"]
    assert b["rows"] == [{"model": "bert", "warm_s": 0.25}] and "commit" not in b


def test_a_run_of_some_rows_keeps_the_others(tmp_path):
    recorder(tmp_path).write("made_up", [{"id": "a", "columns": COLUMNS, "rows": [
        {"model": "gpt2", "warm_s": 0.5}, {"model": "bert", "warm_s": 0.7}]}],
        threads=1, describe=DESCRIBE)
    path = recorder(tmp_path).write(
        "made_up", [{"id": "a", "rows": [{"model": "bert", "warm_s": 0.3},
                                         {"model": "llama", "warm_s": 0.4}]}],
        threads=1, merge_on={"a": ("model",)})
    (table,) = json.loads(path.read_text())["tables"]
    assert table["rows"] == [{"model": "gpt2", "warm_s": 0.5}, {"model": "bert", "warm_s": 0.3},
                             {"model": "llama", "warm_s": 0.4}]
    assert "1 other rows from" in table["load"]


def test_a_file_that_breaks_the_schema_is_not_written(tmp_path):
    with pytest.raises(ValueError, match="row 0"):
        recorder(tmp_path).write("made_up", [{"id": "a", "columns": COLUMNS,
                                              "rows": [{"model": "gpt2", "extra": 1}]}],
                                 threads=1, describe=DESCRIBE)
    assert not (tmp_path / "made_up.json").exists()


def test_the_render_script_renders_what_was_written(tmp_path):
    cli = json.loads((render.RESULTS / "cli.json").read_text())
    (tmp_path / "cli.json").write_text(results.dumps(cli))
    rows = [{"command": "`ls`", "end_to_end_s": 9.87, "cpu_s": 1.0, "in_process_s": 0.5}]
    recorder(tmp_path).write("cli", [{"id": "commands", "rows": rows}], threads="no torch")
    written = render.load_results(tmp_path)
    page, seen = render.render_page(
        "<!-- table: cli/commands -->\n<!-- end -->\n", written)
    assert seen == {"cli/commands"}
    assert "| `ls` | 9.87 | 1.00 | 0.50 |" in page
    assert "python -m tools.bench.made_up --fast" in page and "at `" in page


def test_the_command_line_leaves_out_where_the_rows_went():
    line = results.command_line("tools.bench.x", ["--results", "--results-dir", "/tmp/x",
                                                  "--rows", "a/*,b", "--results-dir=/y"],
                                prefix="MALLOC_MMAP_THRESHOLD_=65536")
    assert line == "MALLOC_MMAP_THRESHOLD_=65536 python -m tools.bench.x --rows 'a/*,b'"
