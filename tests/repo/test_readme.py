"""README.md is the operator's front door and docs/ holds the internals:
every relative link of README.md and docs/*.md leads to a file that exists
(and to a heading that exists, for a `#anchor` into a Markdown file), README
has no heading twice, stays short, and shows the settings before any
internals."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.vllm_trees import REPO

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MAX_README_LINES = 350

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def prose(text: str) -> str:
    """The text without fenced code blocks (a `# comment` there is no heading)."""
    return FENCE.sub("", text)


def headings(text: str) -> list[str]:
    return [match.group(2) for match in HEADING.finditer(prose(text))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped except
    '-' and '_', each space a '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor of a page; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = set()
    for heading in headings(path.read_text()):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path: Path) -> list[str]:
    text = CODE_SPAN.sub("", prose(path.read_text()))
    return [match.group(1) for match in LINK.finditer(text)]


def test_pages_exist():
    names = {page.name for page in PAGES}
    assert {"README.md", "stall-recovery.md", "benchmarks.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_leads_somewhere(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto: and the like
        file_part, _, anchor = target.partition("#")
        destination = (page.parent / file_part).resolve() if file_part else page
        if not destination.exists():
            broken.append(f"{target}: no file {destination.relative_to(REPO)}")
        elif anchor and destination.suffix == ".md":
            if anchor not in anchors(destination):
                broken.append(f"{target}: no such heading in {destination.name}")
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_readme_has_no_heading_twice():
    seen = headings(README.read_text())
    repeated = sorted({heading for heading in seen if seen.count(heading) > 1})
    assert not repeated, repeated


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines"


def test_readme_opens_with_the_quickstart_and_links_every_docs_page():
    text = README.read_text()
    order = headings(text)
    assert order[1].startswith("Quickstart"), order[:2]
    linked = {target.split("#")[0] for target in links(README)}
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in linked, f"README does not link {page.name}"


def test_readme_settings_come_before_the_internals():
    order = headings(README.read_text())
    for settings in ("Launching Kimi-K3", "Configuration", "Launcher settings"):
        assert order.index(settings) < order.index("How it works"), settings
