"""The README stays a front page and the book's links lead somewhere.

README.md is at most 200 lines (the manual is docs/, whose table of contents is
docs/SUMMARY.md), and every relative link of README.md and docs/*.md names a file of the
repository and, when it has an anchor into a Markdown file, a heading of that file."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 200

# [text](target) and ![alt](target); the target ends at the first space (a title may follow).
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s[^)]*)?\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text):
    """The lines of a Markdown page outside fenced code blocks."""
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            yield line


def without_code_spans(line):
    return re.sub(r"`[^`]*`", "", line)


def anchors(page):
    """The anchors GitHub gives the headings of a page: lower case, punctuation dropped, spaces
    as hyphens, and -1, -2, ... for repeats."""
    seen = {}
    result = set()
    for line in prose(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else f"{slug}-{n}")
    return result


def links():
    for page in PAGES:
        for line in prose(page.read_text()):
            for m in LINK.finditer(without_code_spans(line)):
                target = m.group(1)
                if re.match(r"[a-z][a-z0-9+.-]*:", target):
                    continue  # https://, mailto: and the like
                yield pytest.param(page, target, id=f"{page.relative_to(REPO)}->{target}")


def test_readme_is_a_front_page():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move the detail into a "
        "chapter of docs/ (docs/SUMMARY.md lists them)"
    )


def test_every_page_links_somewhere():
    assert len(list(links())) > 50


@pytest.mark.parametrize("page,target", list(links()))
def test_relative_link_resolves(page, target):
    path, _, anchor = target.partition("#")
    file = (page.parent / path).resolve() if path else page
    assert file.exists(), f"{page.relative_to(REPO)}: {target} names no file ({file})"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), (
            f"{page.relative_to(REPO)}: {target}: {file.name} has no heading with the anchor "
            f"#{anchor} (it has {sorted(anchors(file))})"
        )


def test_the_summary_lists_every_chapter():
    summary = (REPO / "docs" / "SUMMARY.md").read_text()
    listed = {Path(m.group(1)).name for m in LINK.finditer(summary)}
    chapters = {p.name for p in PAGES if p.parent.name == "docs" and p.name != "SUMMARY.md"}
    assert chapters <= listed, f"docs/SUMMARY.md does not list {sorted(chapters - listed)}"
