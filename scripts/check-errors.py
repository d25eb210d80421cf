#!/usr/bin/env python3
"""Check that the manual documents every error, WARNING and LOG line the extension raises,
and every setting it defines.

Errors: every message the code can raise, with its SQLSTATE, must have a row in
docs/errors.md whose SQLSTATE cell names that SQLSTATE and whose message cell holds the
message's fixed words, in order (the parts between placeholders; a placeholder may be
written in any way: `N`, `R`, `...`). The messages are read from:

* src/server/errors/*.rs: every `SnowflakeError::new(CODE, MESSAGE, ...)`, where CODE is a
  `PgSqlErrorCode::ERRCODE_*` (or a `code` variable set to one in the same function, or an
  `if ... else ...` of two), and MESSAGE a string literal, a `format!` or an
  `if ... else ...` of those;
* `SnowflakeError::internal(...)` anywhere under src/ (XX000, one row for them all);
* `pgrx::error!("...")` anywhere under src/ (XX000);
* sql/finalize.sql: `RAISE EXCEPTION|WARNING|NOTICE 'message' ... USING ERRCODE = 'name'`
  (NOTICE without an ERRCODE: 00000).

SQLSTATEs come from PostgreSQL's errcodes.txt (any installed major's), which names the
pgrx constants and the PL/pgSQL condition names.

Settings: every `snowflake.*` setting defined in src/server/gucs.rs must have a row in the
settings table of docs/configuration.md, and every row there must name a defined setting.

Doors: errors leave through one door. Only the functions PostgreSQL calls may raise: the
SQL functions (`#[pg_extern]`), `_PG_init`, the registry worker's main, WAL redo and the
transaction callback (`#[pg_guard]`), and the datum conversions of the SQL functions'
arguments and results (`from_polymorphic_datum`, `box_into`). A raise is `.raise(`,
`.or_raise(` (or either called as `Type::method(`), `error!(`, `ereport!(`, or an
ErrorReport at `PgLogLevel::ERROR`; importing pgrx's error macros (under any name) is refused
too. Everything below the doors returns a `Result`.

Usage: /usr/bin/python3 scripts/check-errors.py [--root DIR] [--list]
`--list` prints the catalogue read from the code (SQLSTATE, message) and exits.
On failure, prints one line per problem and exits 1. Python 3.11 standard library only.
"""

from __future__ import annotations

import argparse
import glob
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ERRCODES_GLOBS = (
    "/usr/share/postgresql/*/errcodes.txt",
    "/usr/share/postgresql-common/errcodes.txt",
)

# A fixed part of a message shorter than this is not checked (punctuation between two
# placeholders, a lone quote).
MIN_FRAGMENT = 3


@dataclass(frozen=True)
class Message:
    sqlstate: str
    template: str  # placeholders as {…} (Rust) or % (SQL), as in the source
    where: str

    def fragments(self) -> list[str]:
        """The fixed parts between placeholders, stripped of quotes and spaces at the ends."""
        parts = re.split(r"\{[^{}]*\}|%", self.template)
        out = []
        for p in parts:
            p = p.strip().strip('"').strip()
            if len(p) >= MIN_FRAGMENT:
                out.append(p)
        return out


def load_errcodes() -> tuple[dict[str, str], dict[str, str]]:
    """(pgrx constant name -> SQLSTATE, condition name -> SQLSTATE)."""
    by_macro: dict[str, str] = {}
    by_condition: dict[str, str] = {}
    paths = [p for g in ERRCODES_GLOBS for p in sorted(glob.glob(g))]
    if not paths:
        sys.exit("check-errors: no errcodes.txt found (PostgreSQL's server package)")
    for line in Path(paths[-1]).read_text().splitlines():
        fields = line.split()
        if len(fields) >= 3 and re.fullmatch(r"[0-9A-Z]{5}", fields[0]):
            by_macro[fields[2]] = fields[0]
            if len(fields) >= 4:
                by_condition[fields[3]] = fields[0]
    return by_macro, by_condition


def split_args(text: str, start: int) -> tuple[list[str], int]:
    """The top-level arguments of the call whose '(' is at text[start]."""
    assert text[start] == "("
    args, depth, i, current = [], 0, start, []
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            current.append(text[i : j + 1])
            i = j + 1
            continue
        if c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            current.append(m.group(0))
            i += len(m.group(0))
            continue
        if c in "([{":
            depth += 1
            if depth > 1:
                current.append(c)
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(current).strip())
                return args, i + 1
            current.append(c)
        elif c == "," and depth == 1:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(c)
        i += 1
    raise ValueError("unbalanced call")


def balanced(text: str, start: int) -> int:
    """The index after the bracket closing the one at text[start] (string literals skipped)."""
    depth, i = 0, start
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced")


def if_branches(expr: str) -> list[str]:
    """The branches of `if COND { A } else { B }` (or `else if ...`), as expressions."""
    out = []
    while expr.startswith("if "):
        i = 3
        # The condition ends at the first '{' outside brackets and strings.
        depth = 0
        while True:
            c = expr[i]
            if c == '"':
                i = expr.index('"', i + 1)
            elif c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif c == "{" and depth == 0:
                break
            i += 1
        close = balanced(expr, i)
        out.append(expr[i + 1 : close - 1].strip())
        rest = expr[close:].strip()
        if not rest.startswith("else"):
            break
        rest = rest[4:].strip()
        if rest.startswith("{"):
            out.append(rest[1 : balanced(rest, 0) - 1].strip())
            break
        expr = rest
    return out


def message_literals(expr: str) -> list[str]:
    """The message templates an argument can produce: a string literal, `format!("...", ..)`
    (its format string), `String::from("...")`, or `if .. { A } else { B }` of those."""
    expr = expr.strip()
    if expr.startswith("if "):
        return [t for b in if_branches(expr) for t in message_literals(b)]
    m = re.match(r'(?:format!\(|String::from\()?\s*"((?:\\.|[^"\\])*)"', expr)
    if m:
        return [m.group(1).replace('\\"', '"').replace("\\\\", "\\")]
    return []


def constructor_messages(
    errors_rs: Path, root: Path, by_macro: dict[str, str]
) -> tuple[list[Message], list[str]]:
    """The messages of the constructors in one file of src/server/errors/."""
    messages, problems = [], []
    rel = errors_rs.relative_to(root).as_posix()
    text = errors_rs.read_text()
    for m in re.finditer(r"(?:SnowflakeError|ErrorReport)::new\(", text):
        line = text.count("\n", 0, m.start()) + 1
        where = f"{rel}:{line}"
        args, _ = split_args(text, m.end() - 1)
        code_arg, message_arg = args[0], args[1]
        if code_arg == "self.code":
            continue  # SnowflakeError::report: the messages are those of the constructors
        if "ERRCODE_INTERNAL_ERROR" in code_arg and message_arg == "message":
            continue  # SnowflakeError::internal: counted at its callers
        macros = re.findall(r"ERRCODE_[A-Z_]+", code_arg)
        if not macros and code_arg == "code":
            before = text[: m.start()]
            found = re.findall(r"let code = PgSqlErrorCode::(ERRCODE_[A-Z_]+);", before)
            macros = found[-1:]
        if not macros:
            problems.append(f"{where}: cannot tell the SQLSTATE of `{code_arg}`")
            continue
        if re.fullmatch(r"[a-z_]+", message_arg):
            # A variable: the nearest `let NAME = EXPR;` before the call.
            lets = list(re.finditer(rf"let {message_arg} = ", text[: m.start()]))
            if lets:
                at = lets[-1].end()
                message_arg = text[at : text.index(";\n", at)]
        literals = message_literals(message_arg)
        if not literals:
            problems.append(f"{where}: cannot read the message `{message_arg[:60]}`")
            continue
        for macro in macros:
            sqlstate = by_macro.get(macro)
            if sqlstate is None:
                problems.append(f"{where}: unknown {macro}")
                continue
            for literal in literals:
                messages.append(Message(sqlstate, literal, where))
    return messages, problems


def rust_messages(root: Path, by_macro: dict[str, str]) -> tuple[list[Message], list[str]]:
    messages, problems = [], []
    for errors_rs in sorted((root / "src/server/errors").glob("*.rs")):
        more, found = constructor_messages(errors_rs, root, by_macro)
        messages += more
        problems += found
    for path in sorted((root / "src").rglob("*.rs")):
        rel = path.relative_to(root)
        body = path.read_text()
        for m in re.finditer(r"SnowflakeError::internal\(", body):
            line = body.count("\n", 0, m.start()) + 1
            messages.append(Message("XX000", "{internal}", f"{rel}:{line}"))
        for m in re.finditer(r"pgrx::error!\(", body):
            line = body.count("\n", 0, m.start()) + 1
            args, _ = split_args(body, m.end() - 1)
            for literal in message_literals(args[0]):
                messages.append(Message("XX000", literal, f"{rel}:{line}"))
    return messages, problems


SQL_RAISE = re.compile(
    r"RAISE\s+(EXCEPTION|WARNING|NOTICE)\s+'((?:''|[^'])*)'(.*?);", re.DOTALL | re.IGNORECASE
)


def sql_messages(root: Path, by_condition: dict[str, str]) -> tuple[list[Message], list[str]]:
    messages, problems = [], []
    path = root / "sql/finalize.sql"
    text = path.read_text()
    for m in SQL_RAISE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        where = f"sql/finalize.sql:{line}"
        level, template, rest = m.group(1).upper(), m.group(2).replace("''", "'"), m.group(3)
        code = re.search(r"ERRCODE\s*=\s*'([a-z_0-9]+)'", rest)
        if code:
            sqlstate = by_condition.get(code.group(1))
            if sqlstate is None:
                problems.append(f"{where}: unknown condition {code.group(1)}")
                continue
        elif level == "NOTICE":
            sqlstate = "00000"
        else:
            sqlstate = "P0001"
        messages.append(Message(sqlstate, template, where))
    return messages, problems


@dataclass
class Row:
    line: int
    sqlstates: set[str]
    message: str


def doc_rows(path: Path) -> list[Row]:
    """The rows of every table of docs/errors.md whose first column holds SQLSTATEs."""
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2:
            continue
        states = set(re.findall(r"\b[0-9A-Z]{5}\b", cells[0]))
        if states:
            rows.append(Row(n, states, cells[1].replace("\\|", "|")))
    return rows


def documented(message: Message, rows: list[Row]) -> bool:
    if message.template == "{internal}":
        return any("XX000" in r.sqlstates and "internal" in r.message.lower() for r in rows)
    fragments = message.fragments()
    for row in rows:
        if message.sqlstate not in row.sqlstates:
            continue
        at = 0
        for fragment in fragments:
            found = row.message.find(fragment, at)
            if found < 0:
                break
            at = found + len(fragment)
        else:
            return True
    return False


def check_settings(root: Path) -> list[str]:
    defined = set(re.findall(r'c"(snowflake\.[a-z_]+)"', (root / "src/server/gucs.rs").read_text()))
    config = root / "docs/configuration.md"
    rows = {}
    for n, line in enumerate(config.read_text().splitlines(), 1):
        m = re.match(r"\|\s*`(snowflake\.[a-z_]+)`\s*\|", line)
        if m:
            rows[m.group(1)] = n
    problems = [
        f"docs/configuration.md: setting {name} (src/server/gucs.rs) has no row in the settings table"
        for name in sorted(defined - rows.keys())
    ]
    problems += [
        f"docs/configuration.md:{rows[name]}: {name} is not a setting of src/server/gucs.rs"
        for name in sorted(rows.keys() - defined)
    ]
    return problems


# A raise: `.raise(` or `.or_raise(` (also called as `Type::raise(`), pgrx's error macros
# (also imported under another name: see RAISING_IMPORT), or an ErrorReport at ERROR.
RAISING = re.compile(
    r"(?:\.|::)(?:or_)?raise\(|\berror!\(|\bereport!\(|PgLogLevel::ERROR\b"
)
RAISING_IMPORT = re.compile(r"\bpgrx::(?:\{[^}]*\b(?:error|ereport)\b[^}]*\}|(?:error|ereport)\b)")
FN_SIGNATURE = re.compile(
    r"^[ \t]*(?:pub(?:\([^)]*\))?\s+)?(?:const\s+)?(?:async\s+)?(?:unsafe\s+)?"
    r"(?:extern\s+\"[^\"]*\"\s+)?fn\s+(\w+)",
    re.M,
)
# The doors: a function PostgreSQL calls (`#[pg_extern]`: the SQL functions; `#[pg_guard]`:
# `_PG_init`, the registry worker's main, WAL redo, the transaction callback), and the datum
# conversions pgrx calls for the SQL functions' arguments and results.
DOOR_ATTRIBUTES = re.compile(r"#\[pg_(?:extern|guard)\b")
DOOR_FUNCTIONS = {"from_polymorphic_datum", "box_into"}


def is_door(body: str, signature: re.Match) -> bool:
    """Whether the function whose signature this is may raise: its attributes (the lines
    just above it, up to the previous item) name it a door, or it is a datum conversion."""
    if signature.group(1) in DOOR_FUNCTIONS:
        return True
    above = body[: signature.start()].rstrip().splitlines()
    attributes = []
    for line in reversed(above):
        stripped = line.strip()
        if not (stripped.startswith("#[") or stripped.startswith("//") or stripped.endswith(")]")):
            break
        attributes.append(stripped)
    return any(DOOR_ATTRIBUTES.search(a) for a in attributes)


def check_doors(root: Path) -> list[str]:
    """Raising sites outside the doors (see the module's text)."""
    problems = []
    for path in sorted((root / "src").rglob("*.rs")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("src/server/errors/"):
            continue  # where the reports are made and raise() is defined
        body = path.read_text()
        signatures = list(FN_SIGNATURE.finditer(body))
        for m in list(RAISING.finditer(body)) + list(RAISING_IMPORT.finditer(body)):
            line_start = body.rfind("\n", 0, m.start()) + 1
            if body[line_start : m.start()].lstrip().startswith("//"):
                continue
            line = body.count("\n", 0, m.start()) + 1
            if m.re is RAISING_IMPORT:
                if body[line_start : m.start()].lstrip().startswith("use "):
                    problems.append(
                        f"{rel}:{line}: imports pgrx's error macros: raise through "
                        "errors::SnowflakeError at a door instead"
                    )
                continue
            enclosing = [f for f in signatures if f.start() < m.start()]
            if enclosing and is_door(body, enclosing[-1]):
                continue
            name = enclosing[-1].group(1) if enclosing else "?"
            problems.append(
                f"{rel}:{line}: `{name}` raises, but only the SQL functions and PostgreSQL's "
                "entry points may: return the error instead (errors::Result)"
            )
    return problems


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args()
    root = Path(args.root)
    by_macro, by_condition = load_errcodes()
    rust, problems = rust_messages(root, by_macro)
    sql, more = sql_messages(root, by_condition)
    problems += more
    catalogue = rust + sql
    if args.list:
        for m in catalogue:
            print(f"{m.sqlstate}\t{m.template}\t{m.where}")
        return 0
    rows = doc_rows(root / "docs/errors.md")
    seen = set()
    for m in catalogue:
        key = (m.sqlstate, m.template)
        if key in seen:
            continue
        seen.add(key)
        if not documented(m, rows):
            problems.append(
                f"{m.where}: {m.sqlstate} `{m.template}` has no row in docs/errors.md"
            )
    problems += check_settings(root)
    problems += check_doors(root)
    if problems:
        for p in problems:
            print(p)
        return 1
    print(
        f"check-errors: {len(seen)} messages documented in docs/errors.md "
        f"({len(catalogue)} raising sites), settings match docs/configuration.md, "
        "errors leave only through the SQL functions and PostgreSQL's entry points"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
