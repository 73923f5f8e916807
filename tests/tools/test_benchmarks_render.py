"""BENCHMARKS.md's tables are the rendering of benchmarks/results/*.json.

Every results file follows the schema, and rendering the committed files
reproduces the committed pages exactly (run `python -m tools.render_benchmarks`
after changing either). No matplotlib: the pictures are not drawn here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools import render_benchmarks as render

ROOT = Path(__file__).resolve().parents[2]


FILES = sorted(render.RESULTS.glob("*.json"))


def test_there_are_results_and_pages():
    assert len(FILES) >= 5
    assert all(page.exists() for page in render.PAGES)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_results_file_follows_the_schema(path):
    assert render.validate(json.loads(path.read_text()), path.stem) == []


def test_the_pages_are_the_rendering_of_the_results():
    rendered = render.render_pages(render.load_results())
    for page, text in rendered.items():
        assert page.read_text() == text, (
            f"{page.relative_to(ROOT)} differs from its rendering: "
            "run python -m tools.render_benchmarks")


def test_rendering_is_idempotent_and_leaves_text_outside_markers(tmp_path):
    results = render.load_results()
    page = tmp_path / "page.md"
    page.write_text("before\n<!-- table: cli/commands -->\nstale\n<!-- end -->\nafter\n")
    once, seen = render.render_page(page.read_text(), results)
    twice, _ = render.render_page(once, results)
    assert once == twice and seen == {"cli/commands"}
    assert once.startswith("before\n<!-- table: cli/commands -->\n") and once.endswith(
        "<!-- end -->\nafter\n") and "stale" not in once


def test_the_schema_check_catches_what_breaks_it():
    doc = json.loads((render.RESULTS / "cli.json").read_text())
    assert render.validate(doc, "cli") == []
    broken = json.loads(json.dumps(doc))
    broken["commit"] = "HEAD"
    broken["tables"][0]["rows"][0]["extra"] = 1
    del broken["machine"]["cpu"]
    errors = render.validate(broken, "cli")
    assert any("commit" in e for e in errors)
    assert any("row 0" in e for e in errors)
    assert any("'cpu'" in e for e in errors)
    assert render.validate(doc, "other_name") != []


def test_a_marker_without_results_fails():
    with pytest.raises(KeyError):
        render.render_page("<!-- table: nothing/here -->\n<!-- end -->\n", {})


def test_cells_format_as_their_column_says():
    assert render.format_cell(0.0561, {"format": ".3f", "bold": True}) == "**0.056**"
    assert render.format_cell([0.052, 0.054], {"format": ".3f"}) == "0.052-0.054"
    assert render.format_cell([41, 41], {"format": "d", "join": " of "}) == "41 of 41"
    assert render.format_cell(2.27, {"format": ".2f", "suffix": " s"}) == "2.27 s"
    assert render.format_cell(None, {"format": ".2f"}) == ""
    assert render.format_cell(False, {}) == "no"


def test_rendering_the_tables_needs_no_matplotlib():
    code = ("import sys; from tools import render_benchmarks as r; "
            "r.render_pages(r.load_results()); assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
