#!/usr/bin/python3
"""Writes a Debian package's copyright file (DEP-5): this project's paragraphs, then one
paragraph per Rust crate that the library links statically, then the text of every license
those crates use.

snowflake.so contains the code of about 180 crates from crates.io. Their licenses (MIT,
Apache-2.0, BSD-3-Clause, ...) ask that their copyright notices and license texts go with
every binary copy, and Debian's policy asks that the copyright file say so. So the package
build writes that file from the crate graph instead of keeping a hand list that goes stale.

- The crates: `cargo metadata` for the extension's features on this platform, followed along
  normal dependencies only, and not into procedural macros: build and dev dependencies and
  macros run at build time, and none of their code is in the library.
- Their copyright lines: the notices of each crate's license and notice files (LICENSE*,
  COPYING*, COPYRIGHT*, NOTICE*, LICENSES/); where those hold none, the notices at the head of
  its sources (`Copyright ...`, `SPDX-FileCopyrightText:`); where those hold none either, its
  authors from Cargo.toml. A NOTICE file is quoted whole, as Apache-2.0 asks.
- What a crate's files say that its SPDX expression does not (a file under another license, a
  variant of a license's text): packaging/debian/crate-overrides, DEP-5 paragraphs read by a
  person from the crate's files. A paragraph whose Files is a crate's own replaces the
  generated one; a narrower one follows it.
- The license texts: packaging/debian/licenses/<SPDX id>. A license with no file there stops
  the build: a new license needs a person to read it before the package ships it.

Why not cargo-about: it gathers license texts, but a DEP-5 file needs each crate's copyright
notices in its Copyright field, which cargo-about does not extract, and this runs on
Python's standard library in the package build, where cargo-about would be one more build
of several minutes.

    scripts/debian-copyright.py --manifest-path TREE/Cargo.toml --features pg17 \
        --project packaging/debian/copyright --licenses packaging/debian/licenses \
        --overrides packaging/debian/crate-overrides >copyright
"""
import argparse
import json
import os
import re
import subprocess
import sys

LICENSE_FILE = re.compile(r"(?i)^(licen[cs]e|copying|copyright|notice|unlicense)")
NOTICE_FILE = re.compile(r"(?i)^notice")
# Comment leaders in source files (pgrx's headers are "//LICENSE Portions Copyright ...").
COMMENT_LEADER = re.compile(r"^\s*(//[/!]?|/\*+|\*+|#|--)?\s*(LICENSE\b)?\s*")
# A notice: "Copyright [(c)] 2014 Name" or "copyright 2015, Name" anywhere in a line, "© 1995
# IBM", or a line starting "Copyright The X Developers". Not the license texts' own use of the
# word ("copyright license to reproduce", "(c) You must retain", "COPYRIGHT AND PERMISSION").
NOTICE_LINE = re.compile(
    r"(?i:\bcopyright\s*(\(c\)\s*|©\s*)?\[?\d{4})|©\s*\d{4}|^(Copyright|COPYRIGHT)\s*(\([cC]\)|©)?\s*[A-Z]")
SPDX_COPYRIGHT = re.compile(r"^SPDX-FileCopyrightText:\s*(.+)")
# A notice continued on the next line: "Copyright 2011-2017 Google Inc.\n          2013 Jack Lloyd"
# (or one whose parenthesis the line leaves open).
CONTINUATION = re.compile(r"^\s+\d{4}\b")
# Template lines of license texts, not notices: "Copyright [yyyy] [name of copyright owner]".
TEMPLATE = re.compile(r"(?i)\[yyyy\]|\{yyyy\}|<year>|copyright (notice|holder|owner)|copyright and permission notice")
# How far into a source file its header notice may be.
SOURCE_HEAD_LINES = 40
SPDX_TOKEN = re.compile(r"\s*(\(|\)|[A-Za-z0-9.+-]+)")


def fail(message):
    sys.exit(f"debian-copyright.py: {message}")


def host_target():
    rustc = subprocess.run(["rustc", "-vV"], check=True, capture_output=True, text=True).stdout
    return re.search(r"(?m)^host: (\S+)", rustc).group(1)


def linked_crates(manifest, features):
    """The crates.io packages reachable from the workspace's extension through normal
    dependencies other than procedural macros, for FEATURES on this platform."""
    metadata = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--manifest-path", manifest,
         "--filter-platform", host_target(), "--no-default-features",
         "--features", features],
        check=True, capture_output=True, text=True).stdout)
    packages = {p["id"]: p for p in metadata["packages"]}
    nodes = {n["id"]: n for n in metadata["resolve"]["nodes"]}
    workspace = set(metadata["workspace_members"])

    def is_macro(package_id):
        return any("proc-macro" in target["kind"] for target in packages[package_id]["targets"])

    seen, stack = set(), [metadata["resolve"]["root"]]
    while stack:
        node = stack.pop()
        if node in seen or is_macro(node):
            continue
        seen.add(node)
        stack += [d["pkg"] for d in nodes[node]["deps"]
                  if any(kind["kind"] is None for kind in d["dep_kinds"])]
    crates = [packages[i] for i in seen if i not in workspace]
    for crate in crates:
        if crate["source"] is None or not crate["source"].startswith("registry+"):
            fail(f"{crate['name']} {crate['version']} is not from crates.io ({crate['source']}): "
                 "say where its copyright comes from")
    return sorted(crates, key=lambda c: (c["name"], c["version"]))


def parse_spdx(expression):
    """SPDX expression -> tree: ("or"|"and", [children]) or a license id (str).
    Accepts the old "MIT/Apache-2.0" form. WITH exceptions are refused (none is used)."""
    if re.search(r"\bWITH\b", expression):
        fail(f"license exceptions (WITH) are not handled yet: {expression!r}; write the crate's "
             "paragraph in packaging/debian/crate-overrides and teach this script the exception")
    tokens = SPDX_TOKEN.findall(expression.replace("/", " OR "))
    if "".join(tokens).replace(" ", "") != re.sub(r"\s", "", expression.replace("/", "OR")):
        fail(f"cannot read the license expression {expression!r}")
    position = 0

    def peek():
        return tokens[position] if position < len(tokens) else None

    def take():
        nonlocal position
        if position == len(tokens):
            fail(f"license expression ends too early: {expression!r}")
        position += 1
        return tokens[position - 1]

    def operand():
        token = take()
        if token == "(":
            tree = disjunction()
            if take() != ")":
                fail(f"unbalanced parentheses in {expression!r}")
            return tree
        if token.upper() in ("AND", "OR", "WITH") or token == ")":
            fail(f"unexpected {token!r} in {expression!r}")
        return token

    def chain(operator, below):
        children = []

        def add(child):
            # "(A OR B) OR C" is "A OR B OR C".
            if not isinstance(child, str) and child[0] == operator:
                children.extend(child[1])
            else:
                children.append(child)

        add(below())
        while peek() is not None and peek().upper() == operator.upper():
            take()
            add(below())
        return children[0] if len(children) == 1 else (operator, children)

    def conjunction():
        return chain("and", operand)

    def disjunction():
        return chain("or", conjunction)

    tree = disjunction()
    if peek() is not None:
        fail(f"unexpected {peek()!r} in {expression!r}")
    return tree


def dep5_license(tree):
    """DEP-5's License field: "and" binds tighter than "or"; an "or" inside an "and" is
    written with a comma, the form the format gives for that ("A or B, and C")."""
    if isinstance(tree, str):
        return tree
    operator, children = tree
    if operator == "or":
        # An "and" inside may not use the comma form: "A or B, and C or D" would read as
        # "(A or B) and (C or D)".
        rendered = [dep5_license(c) for c in children]
        if any("," in r for r in rendered):
            fail(f"license expression too deep for DEP-5: {tree!r}")
        return " or ".join(rendered)
    parts = []
    for child in children:
        if isinstance(child, str):
            parts.append(child)
        elif child[0] == "or" and all(isinstance(c, str) for c in child[1]):
            parts.append(" or ".join(child[1]))
        else:
            fail(f"license expression too deep for DEP-5: {tree!r}")
    if any(not isinstance(c, str) for c in children):
        return ", and ".join(parts)
    return " and ".join(parts)


def crate_files(crate):
    """The crate's license and notice files, relative to its directory."""
    directory = os.path.dirname(crate["manifest_path"])
    names = sorted(n for n in os.listdir(directory)
                   if LICENSE_FILE.match(n) and os.path.isfile(os.path.join(directory, n)))
    if os.path.isdir(os.path.join(directory, "LICENSES")):
        names += sorted(os.path.join("LICENSES", n) for n in os.listdir(os.path.join(directory, "LICENSES")))
    if crate.get("license_file"):
        names.append(crate["license_file"])
    return directory, list(dict.fromkeys(names))


def notices(path, head=None):
    """The copyright notices of a file (of its first HEAD lines only, when given)."""
    found, previous_was_notice = [], False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f):
            if head is not None and number >= head:
                break
            line = " ".join(COMMENT_LEADER.sub("", raw, count=1).split())
            spdx = SPDX_COPYRIGHT.match(line)
            if spdx:
                found.append(spdx.group(1))
            elif previous_was_notice and CONTINUATION.match(raw):
                found[-1] += "; " + line
                continue
            elif previous_was_notice and found[-1].count("(") > found[-1].count(")"):
                found[-1] += " " + line
                continue
            elif NOTICE_LINE.search(line) and not TEMPLATE.search(line):
                found.append(line)
            else:
                previous_was_notice = False
                continue
            previous_was_notice = True
    return found


def copyright_lines(crate, directory, names):
    lines = [n for name in names for n in notices(os.path.join(directory, name))]
    if not lines:
        # No notice in the license files: those at the head of its sources.
        for root, dirs, files in os.walk(os.path.join(directory, "src")):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".rs"):
                    lines += notices(os.path.join(root, name), SOURCE_HEAD_LINES)
    lines = list(dict.fromkeys(lines))
    if lines:
        return lines
    authors = ", ".join(crate.get("authors") or [])
    if authors:
        return [f"the {crate['name']} authors: {authors}"]
    return [f"the {crate['name']} developers"]


def read_overrides(path):
    """packaging/debian/crate-overrides: {Files value: paragraph text}."""
    overrides = {}
    with open(path, encoding="utf-8") as f:
        text = "\n".join(line for line in f.read().splitlines() if not line.startswith("#"))
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        files = re.match(r"Files: (vendor/\S+)\n", paragraph)
        if not files:
            fail(f"{path}: a paragraph that does not begin with 'Files: vendor/...': {paragraph[:60]!r}")
        overrides[files.group(1)] = paragraph
    return overrides


def paragraph_licenses(paragraph):
    """The license ids a DEP-5 paragraph needs a stand-alone paragraph for: none when its
    License field carries the text itself."""
    match = re.search(r"(?m)^License: (.*)\n?((?: .*\n?)*)", paragraph)
    if match.group(2).strip():
        return set()
    return set(re.findall(r"[A-Za-z0-9.+~-]+", match.group(1))) - {"or", "and"}


def field(name, lines):
    """A DEP-5 field: the first line after the name, the rest indented, empty lines as " .";
    tabs become spaces and trailing blanks go, as lintian asks."""
    lines = [line.replace("\t", "    ").rstrip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    out = [f"{name}: {lines[0]}" if lines[0] else f"{name}:"]
    out += [f" {line}" if line else " ." for line in lines[1:]]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--manifest-path", required=True)
    parser.add_argument("--features", required=True)
    parser.add_argument("--project", required=True, help="this project's DEP-5 paragraphs")
    parser.add_argument("--licenses", required=True, help="directory of license texts by SPDX id")
    parser.add_argument("--overrides", required=True, help="DEP-5 paragraphs read by hand")
    args = parser.parse_args()

    crates = linked_crates(args.manifest_path, args.features)
    overrides = read_overrides(args.overrides)
    with open(args.project, encoding="utf-8") as f:
        project = f.read().rstrip("\n")
    header, _, rest = project.partition("\n\n")
    comment = [
        "",
        f"snowflake.so is statically linked with {len(crates)} Rust crates from crates.io, at",
        "the versions of Cargo.lock. Each has a Files paragraph below, at the path",
        "`cargo vendor --versioned-dirs` gives it. Copyright lines are the notices of the",
        "crate's license files, or else of its sources' headers, or else its authors.",
        "License texts follow at the end.",
    ]
    paragraphs = [header + "\n" + field("Comment", comment), rest]
    used, applied = set(), set()
    for crate in crates:
        if not crate.get("license"):
            fail(f"{crate['name']} {crate['version']} has no SPDX license expression: "
                 "read its license file and write its paragraph in packaging/debian/crate-overrides")
        directory, names = crate_files(crate)
        files = f"vendor/{crate['name']}-{crate['version']}/"
        lines = [f"Files: {files}*",
                 field("Copyright", copyright_lines(crate, directory, names)),
                 f"License: {dep5_license(parse_spdx(crate['license']))}"]
        for notice in [n for n in names if NOTICE_FILE.match(n)]:
            with open(os.path.join(directory, notice), encoding="utf-8", errors="replace") as f:
                lines.append(field("Comment", [f"{notice}:"] + f.read().splitlines()))
        generated = "\n".join(lines)
        own = [key for key in overrides if key.startswith(files)]
        applied.update(own)
        if f"{files}*" not in own:
            own.insert(0, None)
        for key in sorted(own, key=lambda k: (k is not None, k != f"{files}*", k or "")):
            paragraph = generated if key is None else overrides[key]
            used |= paragraph_licenses(paragraph)
            paragraphs.append(paragraph)
    for key in sorted(set(overrides) - applied):
        print(f"debian-copyright.py: {args.overrides}: {key} names no linked crate (a version "
              "that changed?); not used", file=sys.stderr)
    for license_id in sorted(used):
        path = os.path.join(args.licenses, license_id)
        if not os.path.isfile(path):
            fail(f"no text for license {license_id} in {args.licenses}: read the crate's "
                 "license, check that it allows shipping the library, and add its text")
        with open(path, encoding="utf-8") as f:
            paragraphs.append(field("License", [license_id] + f.read().splitlines()))
    sys.stdout.write("\n\n".join(paragraphs) + "\n")


if __name__ == "__main__":
    main()
