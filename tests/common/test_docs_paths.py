"""What README.md, docs/*.md and docs/torch/*.md name exists: every repository
path (files, folders, ``tests/...::test_name`` ids), every link and its
anchor, every ``python -m`` module of this repository, every ``ltc-cache``
subcommand and every ``LTC_CACHE_*`` setting; and every fact the code cites
(``docs/torch/<page>.md#<name>``) is a heading of that page. Documentation
that points at something moved or removed fails here, not in a reader's
shell.

Read as text: no torch import (the CLI's parser imports none)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
TORCH_PAGES = sorted((ROOT / "docs" / "torch").glob("*.md"))
DOCS = [ROOT / "README.md", *PAGES, *TORCH_PAGES]
# Where comments, docstrings and pages cite a fact about torch: its page and name.
_CITING = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *PAGES, *TORCH_PAGES,
           *(path for top in ("ltc_cache", "tests", "tools", "zoo", "examples")
             for path in sorted((ROOT / top).rglob("*.py")))]
_CITATION = re.compile(r"\bdocs/torch/([\w.-]+\.md)#([\w-]+)")
# A fact cited by its number in a numbered list, which moves when a fact is added.
_BY_NUMBER = re.compile(r"\b[Ff]acts?\s+(?:#\s*)?\d+")

# A path of this repository: one of its top-level folders, then a path, and
# optionally a pytest id. Not preceded by what makes it part of another
# path (``~/.cache/ltc_cache``, ``$XDG_CONFIG_HOME/ltc_cache/program.key``).
_TOP = r"(?:ltc_cache|tests|tools|zoo|examples|docs|benchmarks|\.ci)"
_PATH = re.compile(rf"(?<![\w./~$%-]){_TOP}/[\w./*-]*(?:::\w+)?")
_ROOT_FILE = re.compile(r"(?<![\w./-])(?:[A-Z][A-Z_]*\.md|pyproject\.toml)\b")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_MODULE = re.compile(r"\bpython3? -m ([\w.]+)")
_SETTING = re.compile(r"\bLTC_CACHE_[A-Z_]*[A-Z]\b")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_INLINE = re.compile(r"`([^`]+)`")
# `ltc-cache [--dir DIR] [--remote URL | --local] [TIERS] COMMAND`: the word after the options.
_SUBCOMMAND = re.compile(
    r"\bltc-cache((?:\s+--(?:dir|remote)[\s=]+\S+|\s+--local|\s+\[[A-Z]+\])*)\s+([a-z][\w-]*)")
_OWN_PACKAGES = {"ltc_cache", "tools", "zoo", "tests", "examples"}


def _text(doc: Path) -> str:
    return doc.read_text(encoding="utf-8")


def _code(text: str) -> Iterator[str]:
    """The fenced blocks and inline code spans of a markdown text."""
    for block in _FENCE.finditer(text):
        yield block.group(0)
    for span in _INLINE.finditer(_FENCE.sub("", text)):
        yield span.group(1)


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    anchors: set[str] = set()
    for line in _FENCE.sub("", _text(doc)).splitlines():
        match = re.match(r"#{1,6}\s+(.*)", line)
        if not match:
            continue
        base = slug = _slug(match.group(1))
        count = 0
        while slug in anchors:
            count += 1
            slug = f"{base}-{count}"
        anchors.add(slug)
    return anchors


def _missing_path(name: str) -> str | None:
    path, _, test = name.rstrip(".,:;").partition("::")
    if "*" in path:
        return None if any(ROOT.glob(path)) else "matches nothing"
    target = ROOT / path
    if not target.exists():
        return "no such file or folder"
    if test and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{test}\b",
                              target.read_text(encoding="utf-8"), re.M):
        return f"{path} has no {test}"
    return None


def _subcommands() -> set[str]:
    from ltc_cache.cli.parser import build_parser

    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    raise AssertionError("ltc-cache's parser has no subcommands")


def _settings() -> set[str]:
    return set(_SETTING.findall((ROOT / "ltc_cache" / "config.py").read_text(encoding="utf-8")))


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_path_named_exists(doc):
    text = _text(doc)
    names = {*_PATH.findall(text), *_ROOT_FILE.findall(text)}
    problems = {name: why for name in sorted(names) if (why := _missing_path(name))}
    assert not problems, problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_link_and_anchor_exists(doc):
    problems = {}
    for target in _LINK.findall(_text(doc)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            problems[target] = "no such file"
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            problems[target] = f"no heading with anchor #{anchor}"
    assert not problems, problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_module_run_with_python_m_exists(doc):
    problems = []
    for module in set(_MODULE.findall(_text(doc))):
        if module.split(".")[0] not in _OWN_PACKAGES:
            continue  # pytest, venv, pip
        base = ROOT.joinpath(*module.split("."))
        if not (base.with_suffix(".py").is_file() or (base / "__main__.py").is_file()):
            problems.append(module)
    assert not problems, sorted(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_tools_are_run_as_modules(doc):
    # Tools import each other and zoo/ as packages: a script path would not find them.
    assert not re.findall(r"python3? tools/\S+", _text(doc))


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_ltc_cache_subcommand_exists(doc):
    known = _subcommands()
    named = {match.group(2) for code in _code(_text(doc)) for match in _SUBCOMMAND.finditer(code)}
    assert named <= known, sorted(named - known)


@pytest.mark.parametrize("doc", DOCS, ids=lambda doc: str(doc.relative_to(ROOT)))
def test_every_setting_named_is_read(doc):
    named = set(_SETTING.findall(_text(doc)))
    unknown = named - _settings()
    assert not unknown, sorted(unknown)


def test_every_setting_is_documented():
    documented = _SETTING.findall(_text(ROOT / "docs" / "configuration.md"))
    assert _settings() <= set(documented), sorted(_settings() - set(documented))


def test_the_readme_names_every_page_of_docs():
    readme = _text(ROOT / "README.md")
    pages = [page.name for page in PAGES]
    assert all(f"docs/{page}" in readme for page in pages), pages


def test_the_design_index_links_every_torch_page():
    assert TORCH_PAGES
    index = _text(ROOT / "docs" / "design.md")
    missing = [page.name for page in TORCH_PAGES if f"](torch/{page.name})" not in index]
    assert not missing, missing


@pytest.mark.parametrize("source", _CITING, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_cited_fact_is_a_heading_of_its_page(source):
    problems = {}
    for page, name in _CITATION.findall(_text(source)):
        target = ROOT / "docs" / "torch" / page
        if not target.is_file():
            problems[f"{page}#{name}"] = "no such page"
        elif name not in _anchors(target):
            problems[f"{page}#{name}"] = "no heading with that name"
    assert not problems, problems


@pytest.mark.parametrize("source", _CITING, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_fact_is_cited_by_number(source):
    assert not _BY_NUMBER.findall(_text(source))
