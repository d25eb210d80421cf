#!/usr/bin/env python3
"""Check the links of the project's Markdown documentation, without the network.

Checks README.md, CHANGELOG.md, CONTRIBUTING.md and every docs/**/*.md:

* every relative link (`[text](target)`, `![alt](target)`, `[text][ref]` with its
  `[ref]: target` definition, `<a href="...">`, `<img src="...">`) names a file or directory
  that exists in the repository;
* every `#anchor`, on the same page or on another Markdown page, matches a heading of the
  target page under GitHub's slug rules, or an explicit `<a id="...">` / `<a name="...">`;
* README.md stays under README_MAX_LINES lines, so that it remains an introduction;
* every docs page is linked from README.md or from another docs page;
* every SVG picture linked is well-formed, with a <title>.

Links inside fenced code blocks, inline code and HTML comments are not links on GitHub and
are ignored. External links (`http:`, `https:`, `mailto:`, any other scheme) are counted,
never fetched.

Why not lychee, which checks links and anchors offline too: the last three rules are this
project's own, and lychee would be a build of several minutes on every fresh machine to
replace the part of this file that the first two rules take.

Usage: /usr/bin/python3 scripts/check-docs.py [--root DIR]
On failure, prints one `FILE:LINE: message` per problem and exits 1; on success, prints one
summary line and exits 0. Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import bisect
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote
from xml.etree import ElementTree

# The README is the manual's front page: past this it should move text into docs/.
README_MAX_LINES = 400

# An opening code fence: three or more backticks or tildes. Any indentation is accepted
# because fences inside list items are indented to the item's content.
FENCE_OPEN = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$")
ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
# Lines that cannot be the text of a setext heading: list items, quotes, tables, headings,
# indented code. (A `---` under them is a thematic break or a table row, not an underline.)
NOT_SETEXT_TEXT = re.compile(r"^(?: {4,}|\t| {0,3}(?:[-*+>|#]|\d+[.)])(?:[ \t]|$))")

# Link text: anything but unescaped brackets, or one level of nested brackets (`[a [b] c]`).
_TEXT = r"(?:[^\[\]\\]|\\.|\[(?:[^\[\]\\]|\\.)*\])*"
# A destination: `<...>`, or a run without spaces in which parentheses are balanced once.
_DEST = r"<[^<>\n]*>|[^\s()<>]*(?:\([^\s()]*\)[^\s()<>]*)*"
_TITLE = r"\"[^\"]*\"|'[^']*'|\([^()]*\)"
INLINE_LINK = re.compile(
    rf"(?<!\\)!?\[(?P<text>{_TEXT})\]\(\s*(?P<dest>{_DEST})(?:\s+(?:{_TITLE}))?\s*\)",
    re.DOTALL,
)
# `[text][ref]` and `[text][]` (a collapsed reference uses the text as its label).
REFERENCE_LINK = re.compile(rf"(?<![\\\]])\[(?P<text>{_TEXT})\]\[(?P<ref>[^\[\]]*)\](?!\()")
REFERENCE_DEF = re.compile(r"^ {0,3}\[(?P<label>[^\]]+)\]:[ \t]*(?P<dest><[^<>\n]*>|\S+)", re.MULTILINE)
HTML_LINK = re.compile(
    r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<bare>[^\s>]+))",
    re.IGNORECASE,
)
HTML_ANCHOR = re.compile(
    r"<a\b[^>]*?\b(?:id|name)\s*=\s*(?:\"(?P<dq>[^\"]*)\"|'(?P<sq>[^']*)'|(?P<bare>[^\s>]+))",
    re.IGNORECASE,
)
AUTOLINK = re.compile(r"<(?:https?|mailto):[^\s<>]*>", re.IGNORECASE)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
SCHEME = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*:|//)")
# GitHub's line anchors on a file view: #L12 or #L12-L20.
LINE_ANCHOR = re.compile(r"^L(\d+)(?:-L(\d+))?$")


@dataclass(frozen=True)
class Problem:
    """One broken thing, reported as FILE:LINE: message."""

    path: Path
    line: int
    message: str


@dataclass
class Page:
    """A Markdown file as GitHub renders it: its code-free text and its anchors."""

    path: Path
    text: str
    masked: str  # the text with code and comments blanked out, same offsets and lines
    anchors: set[str]
    line_starts: list[int] = field(default_factory=list)

    def line_of(self, offset: int) -> int:
        """The 1-based line number of a character offset in the text."""
        return bisect.bisect_right(self.line_starts, offset)


@dataclass
class Report:
    """What the run found: problems, and counts for the summary line."""

    problems: list[Problem] = field(default_factory=list)
    files: int = 0
    links: int = 0
    anchors: int = 0
    external: int = 0
    # docs page -> pages that link to it (for the unlinked-page check)
    linked_from: dict[Path, set[Path]] = field(default_factory=dict)


# ---------------------------------------------------------------------------- parsing


def fenced_lines(lines: list[str]) -> set[int]:
    """Indexes of the lines that belong to fenced code blocks, fences included.

    A block closes at a fence of the same character at least as long as the opening one;
    an unclosed block runs to the end of the file, as in CommonMark.
    """
    inside: set[int] = set()
    opening = None
    for index, line in enumerate(lines):
        if opening is None:
            match = FENCE_OPEN.match(line)
            # A backtick fence's info string may not contain backticks (that is inline code).
            if match and not (match.group(1)[0] == "`" and "`" in match.group(2)):
                opening = match.group(1)
                inside.add(index)
            continue
        inside.add(index)
        stripped = line.strip()
        if stripped and set(stripped) == {opening[0]} and len(stripped) >= len(opening):
            opening = None
    return inside


def blank(text: str) -> str:
    """The text with every character but line ends replaced by a space."""
    return re.sub(r"[^\n]", " ", text)


def mask_code_spans(text: str) -> str:
    """Blank out inline code: a run of N backticks up to the next run of exactly N.

    A span never crosses a blank line (a paragraph end); an unmatched run is literal.
    """
    out = []
    position = 0
    for run in re.finditer(r"`+", text):
        if run.start() < position:
            continue  # inside a span already masked
        closing = re.compile(rf"(?<!`){run.group()}(?!`)")
        end = closing.search(text, run.end())
        if end is None or re.search(r"\n[ \t]*\n", text[run.end() : end.start()]):
            continue
        out.append(text[position : run.start()])
        out.append(blank(text[run.start() : end.end()]))
        position = end.end()
    out.append(text[position:])
    return "".join(out)


def mask(text: str) -> str:
    """The text as far as links go: fenced code, inline code and HTML comments blanked."""
    lines = text.split("\n")
    fenced = fenced_lines(lines)
    text = "\n".join(blank(line) if i in fenced else line for i, line in enumerate(lines))
    text = mask_code_spans(text)
    return HTML_COMMENT.sub(lambda m: blank(m.group()), text)


def heading_text(raw: str) -> str:
    """A heading's rendered text: links and images become their text, HTML tags vanish."""
    raw = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    raw = re.sub(r"!?\[([^\]]*)\]\[[^\]]*\]", r"\1", raw)
    return re.sub(r"<[^>]+>", "", raw).strip()


def slug(text: str) -> str:
    """GitHub's anchor for a heading text (github-slugger).

    Lowercase; keep letters, marks, digits, spaces, hyphens and underscores, drop every
    other character; then each space becomes a hyphen (so `a → b` gives `a--b`).
    """
    kept = (
        ch
        for ch in text.lower()
        if ch in " -_" or unicodedata.category(ch)[0] in "LMN"
    )
    return "".join(kept).replace(" ", "-")


def headings(lines: list[str], fenced: set[int]) -> list[str]:
    """The texts of the page's ATX and setext headings, in order, outside code blocks."""
    found = []
    for index, line in enumerate(lines):
        if index in fenced:
            continue
        atx = ATX_HEADING.match(line)
        if atx:
            found.append(heading_text(atx.group(2) or ""))
            continue
        if SETEXT_UNDERLINE.match(line):
            text = setext_text(lines, fenced, index)
            if text is not None:
                found.append(heading_text(text))
    return found


def setext_text(lines: list[str], fenced: set[int], underline: int) -> str | None:
    """The text of the setext heading underlined at this line, or None if it is not one.

    The text is the paragraph just above (its lines joined as GitHub's soft line breaks,
    which the slug drops); a list item, quote, table row or heading above makes the
    underline a thematic break or table row instead.
    """
    start = underline
    while start > 0 and lines[start - 1].strip() and start - 1 not in fenced:
        start -= 1
    if start == underline:
        return None
    paragraph = lines[start:underline]
    if NOT_SETEXT_TEXT.match(paragraph[0]) or any(ATX_HEADING.match(line) for line in paragraph):
        return None
    return "\n".join(line.strip() for line in paragraph)


def anchors_of(text: str, masked: str) -> set[str]:
    """Every anchor a link can name on this page: heading slugs and explicit HTML ids.

    Repeated slugs get -1, -2, ... in document order, as on GitHub.
    """
    lines = text.split("\n")
    seen: set[str] = set()
    for heading in headings(lines, fenced_lines(lines)):
        base = slug(heading)
        candidate, n = base, 0
        while candidate in seen:
            n += 1
            candidate = f"{base}-{n}"
        seen.add(candidate)
    for match in HTML_ANCHOR.finditer(masked):
        seen.add(first_group(match))
    return seen


def first_group(match: re.Match) -> str:
    """The value of a quoted or bare HTML attribute match."""
    return next(g for g in (match.group("dq"), match.group("sq"), match.group("bare")) if g is not None)


def load_page(path: Path) -> Page:
    """Read and parse one Markdown file."""
    text = path.read_text(encoding="utf-8")
    masked = mask(text)
    starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
    return Page(path=path, text=text, masked=masked, anchors=anchors_of(text, masked), line_starts=starts)


# ---------------------------------------------------------------------------- links


def inline_links(masked: str, base: int = 0):
    """Yield (offset of the destination, destination) for every inline link and image.

    Recurses into link texts, so that the image inside `[![alt](img)](target)` is found.
    """
    for match in INLINE_LINK.finditer(masked):
        yield base + match.start("dest"), match.group("dest")
        yield from inline_links(match.group("text"), base + match.start("text"))


def normalize_label(label: str) -> str:
    """Reference labels match case-insensitively, with runs of white space as one space."""
    return " ".join(label.split()).casefold()


def page_links(page: Page, report: Report):
    """Yield (line, destination) for every link of the page, references resolved.

    An undefined `[text][ref]` is a problem of its own (GitHub shows it as plain text).
    """
    masked = page.masked
    for offset, dest in inline_links(masked):
        yield page.line_of(offset), dest
    definitions = {}
    for match in REFERENCE_DEF.finditer(masked):
        definitions.setdefault(normalize_label(match.group("label")), match.group("dest"))
        # Each definition is checked once, where it is written, however often it is used.
        yield page.line_of(match.start("dest")), match.group("dest")
    for match in REFERENCE_LINK.finditer(masked):
        label = normalize_label(match.group("ref") or match.group("text"))
        if label not in definitions:
            report.problems.append(
                Problem(page.path, page.line_of(match.start()), f"reference [{label}] is not defined")
            )
    for match in HTML_LINK.finditer(masked):
        yield page.line_of(match.start()), first_group(match)
    for match in AUTOLINK.finditer(masked):
        yield page.line_of(match.start()), match.group()[1:-1]


class Checker:
    """Resolves links against the repository tree and the pages' anchors."""

    def __init__(self, root: Path):
        self.root = root
        self.pages: dict[Path, Page] = {}
        self.report = Report()

    def page(self, path: Path) -> Page:
        """A parsed Markdown page, read once."""
        if path not in self.pages:
            self.pages[path] = load_page(path)
        return self.pages[path]

    def problem(self, page: Page, line: int, message: str) -> None:
        """Record a problem at a line of a page."""
        self.report.problems.append(Problem(page.path, line, message))

    def check_page(self, path: Path) -> None:
        """Check every link of one page."""
        page = self.page(path)
        for line, dest in page_links(page, self.report):
            self.check_link(page, line, dest.strip())

    def check_link(self, page: Page, line: int, dest: str) -> None:
        """Check one destination: its file or directory, then its anchor."""
        if dest.startswith("<") and dest.endswith(">"):
            dest = dest[1:-1]
        if not dest:
            self.problem(page, line, "empty link target")
            return
        if SCHEME.match(dest):
            self.report.external += 1
            return
        self.report.links += 1
        location, _, anchor = dest.partition("#")
        location = unquote(location.split("?", 1)[0])
        if location:
            target = self.resolve(page, line, location)
            if target is None:
                return
        else:
            target = page.path
        self.note_docs_link(page.path, target)
        if anchor:
            self.report.anchors += 1
            self.check_anchor(page, line, dest, target, unquote(anchor))

    def resolve(self, page: Page, line: int, location: str) -> Path | None:
        """The existing file or directory a relative link names, or None (reported)."""
        if location.startswith("/"):
            # GitHub resolves a leading slash from the repository's root.
            candidate = self.root / location.lstrip("/")
        else:
            candidate = page.path.parent / location
        target = Path(os.path.normpath(candidate))
        if target != self.root and self.root not in target.parents:
            self.problem(page, line, f"{location}: points outside the repository")
            return None
        if not target.exists():
            self.problem(page, line, f"{location}: no such file or directory")
            return None
        if target.suffix.lower() == ".svg":
            self.check_svg(page, line, location, target)
        return target

    def check_svg(self, page: Page, line: int, location: str, target: Path) -> None:
        """A picture of the manual: well-formed SVG with a <title> (what a screen reader and
        a browser's tooltip give)."""
        try:
            svg = ElementTree.parse(target).getroot()
        except ElementTree.ParseError as e:
            self.problem(page, line, f"{location}: not well-formed SVG: {e}")
            return
        ns = "{http://www.w3.org/2000/svg}"
        if svg.tag != ns + "svg":
            self.problem(page, line, f"{location}: the root element is not <svg>")
        elif svg.find(ns + "title") is None or not (svg.find(ns + "title").text or "").strip():
            self.problem(page, line, f"{location}: the SVG has no <title>")

    def check_anchor(self, page: Page, line: int, dest: str, target: Path, anchor: str) -> None:
        """Check `#anchor` against the target's headings (Markdown) or lines (#L12)."""
        if target.is_dir():
            readme = target / "README.md"
            if not readme.is_file():
                self.problem(page, line, f"{dest}: an anchor on a directory without README.md")
                return
            target = readme
        if target.suffix.lower() in (".md", ".markdown"):
            if anchor not in self.page(target).anchors:
                where = "this page" if target == page.path else self.relative(target)
                self.problem(page, line, f"{dest}: no heading or anchor #{anchor} in {where}")
            return
        lines = LINE_ANCHOR.match(anchor)
        if lines is None:
            self.problem(page, line, f"{dest}: #{anchor} can only be checked in a Markdown file")
            return
        count = target.read_bytes().count(b"\n") + 1
        if max(int(n) for n in lines.groups() if n) > count:
            self.problem(page, line, f"{dest}: {self.relative(target)} has only {count} lines")

    def note_docs_link(self, source: Path, target: Path) -> None:
        """Remember links into docs/ from README.md and docs pages (not from a page itself)."""
        if target != source and self.root / "docs" in target.parents:
            self.report.linked_from.setdefault(target, set()).add(source)

    def relative(self, path: Path) -> str:
        """A path as the messages show it: relative to the repository's root."""
        return path.relative_to(self.root).as_posix()


# ---------------------------------------------------------------------------- the run


def markdown_files(root: Path) -> list[Path]:
    """The files checked: README.md, CHANGELOG.md, CONTRIBUTING.md and docs/**/*.md, those
    that exist."""
    files = [
        root / name
        for name in ("README.md", "CHANGELOG.md", "CONTRIBUTING.md")
        if (root / name).is_file()
    ]
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(p for p in docs.rglob("*.md") if p.is_file())
    return files


def check_readme_length(root: Path, report: Report) -> None:
    """README.md is the front page: it must stay under README_MAX_LINES lines (`wc -l`)."""
    readme = root / "README.md"
    if not readme.is_file():
        report.problems.append(Problem(readme, 1, "README.md is missing"))
        return
    count = readme.read_bytes().count(b"\n")
    if count >= README_MAX_LINES:
        report.problems.append(
            Problem(readme, README_MAX_LINES, f"README.md has {count} lines; keep it under "
                    f"{README_MAX_LINES} and move the detail into docs/")
        )


def check_unlinked_docs(root: Path, files: list[Path], report: Report) -> None:
    """Every docs page must be reachable: linked from README.md or another docs page.

    Links from CHANGELOG.md do not count: it is a history, not a way into the manual.
    """
    readme = root / "README.md"
    docs = root / "docs"
    for path in files:
        if docs not in path.parents:
            continue
        sources = report.linked_from.get(path, set())
        if not any(s == readme or docs in s.parents for s in sources):
            report.problems.append(Problem(path, 1, "not linked from README.md or any other docs page"))


def run(root: Path) -> Report:
    """Check everything under root; return the report."""
    checker = Checker(root)
    files = markdown_files(root)
    for path in files:
        checker.check_page(path)
    check_readme_length(root, checker.report)
    check_unlinked_docs(root, files, checker.report)
    checker.report.files = len(files)
    return checker.report


def default_root() -> Path:
    """The repository's root: this script lives in its scripts/ directory."""
    return Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None,
                        help="the repository to check (default: the one holding this script)")
    args = parser.parse_args(argv)
    root = (args.root or default_root()).resolve()
    if not root.is_dir():
        print(f"check-docs: {root}: not a directory", file=sys.stderr)
        return 2
    report = run(root)
    if report.problems:
        for p in sorted(set(report.problems), key=lambda p: (str(p.path), p.line, p.message)):
            print(f"{p.path.relative_to(root).as_posix()}:{p.line}: {p.message}")
        print(f"check-docs: {len(set(report.problems))} problem(s)", file=sys.stderr)
        return 1
    print(
        f"check-docs: {report.files} files, {report.links} links checked "
        f"({report.anchors} with anchors), {report.external} external links not fetched"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
