"""bench/README.md's figures are backed by the reports the benchmarks wrote: every table of
figures names its JSON file in `bench/results/` in the paragraph just before it, every file
the page names exists, and every report in `bench/results/` is named by the page."""

from __future__ import annotations

import re

from consumer.testing.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"
README = BENCH / "README.md"
_RESULT = re.compile(r"results/([a-z0-9][\w.-]*\.(?:json|png))")


def _blocks(text: str) -> list[list[str]]:
    """The page as blocks of lines separated by blank lines, outside code fences."""
    blocks: list[list[str]] = [[]]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    return [b for b in blocks if b]


def figure_tables(text: str) -> list[tuple[str, str]]:
    """(the table's header row, the paragraph before it) for each table with a digit in its body."""
    out = []
    blocks = _blocks(text)
    for i, block in enumerate(blocks):
        if not block[0].startswith("|"):
            continue
        body = "\n".join(block[2:])
        if re.search(r"\d", body):
            out.append((block[0], "\n".join(blocks[i - 1]) if i else ""))
    return out


def test_every_table_of_figures_names_its_json() -> None:
    unnamed = [header for header, before in figure_tables(README.read_text()) if ".json" not in before]
    assert not unnamed, f"tables without a results/*.json named in the paragraph before them: {unnamed}"


def test_every_result_the_page_names_exists() -> None:
    named = set(_RESULT.findall(README.read_text()))
    missing = sorted(name for name in named if not (BENCH / "results" / name).exists())
    assert not missing, f"bench/README.md names files bench/results/ lacks: {missing}"


def test_every_json_report_is_named_by_the_page() -> None:
    named = set(_RESULT.findall(README.read_text()))
    unnamed = sorted(p.name for p in (BENCH / "results").glob("*.json") if p.name not in named)
    assert not unnamed, f"reports in bench/results/ that bench/README.md does not name: {unnamed}"


def test_the_table_finder_sees_figures_and_their_caption() -> None:
    page = (
        "Intro.\n\nFrom `results/a.json`:\n\n| x | y |\n| --- | --- |\n| a | 1 |\n\n"
        "A table without figures:\n\n| k | what |\n| --- | --- |\n| a | b |\n"
    )
    assert figure_tables(page) == [("| x | y |", "From `results/a.json`:")]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_into_the_page_name_its_headings() -> None:
    root = BENCH.parent
    anchors = {_slug(m) for m in re.findall(r"^#+ (.+)$", README.read_text(), re.M)}
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    wanted = {
        (page.name, anchor)
        for page in pages
        for anchor in re.findall(r"bench/README\.md#([\w-]+)", page.read_text(encoding="utf-8"))
    }
    broken = sorted((name, anchor) for name, anchor in wanted if anchor not in anchors)
    assert wanted and not broken, f"links to headings bench/README.md lacks: {broken}"
