"""Issue 35, attack 1: no SQL script the extension ships runs a function or operator that a
role other than the bootstrap superuser planted.

A trusted CREATE EXTENSION (and each ALTER EXTENSION UPDATE step) runs the scripts as the
bootstrap superuser with search_path = <extension's schema>, pg_temp. A call whose arguments
are not exactly of a declared type (snowflake_to_timestamp(0): 0 is an integer) is resolved
among every overload on that path, so an overload planted in the extension's schema (public,
which the database owner owns on PostgreSQL 15 and later, and which every role may write
where it kept PostgreSQL 14's rights) that matches better runs instead, as a superuser.

The sweep is derived from the scripts themselves (share/extension/snowflake--*.sql as
installed; a call added to a script is swept without a change here): every name written as
a call (`name(`, in the code and in the strings that hold dynamic SQL) and every operator
symbol gets look-alikes of each argument-type variant: for every call, each of EVERY's types
alone, every combination of COMMON up to three arguments, and the combinations of what each
argument written there may match better than the real function (an integer literal: integer,
bigint, numeric, double precision; a string literal: text; a cast: its type); variadic and
polymorphic forms; operators with every pair of COMMON and as prefix operators. They return
what the real function returns (so that a captured call goes on: a planted
snowflake_to_timestamp(integer) records a false epoch) and are planted in public and in the
extension's schema. Each says it ran (a WARNING, which survives a rollback), records itself
and makes its planter a superuser. Type names cannot be planted over: pg_catalog is searched
first for them in a script, and a cast between built-in types only their owner may create.
Then:

- CaptureSweep.test_install_*: CREATE EXTENSION as a database owner (trusted; in public, and
  in a schema of its own) and as a superuser where an ordinary role may write public;
- CaptureSweep.test_update_*: from every earlier version PostgreSQL can update from, the
  look-alikes planted before ALTER EXTENSION UPDATE (so before each of its steps), by the
  extension's owner (a database owner who installed it when earlier versions were trusted)
  and by an ordinary role while a superuser updates;
- none ran, the role is no superuser, and nothing of the extension depends on a look-alike
  (a call resolved into a default or a view would run later, as whoever uses it);
- EarlierVersions: a database owner cannot install any earlier version (their scripts and
  converters are unsafe), and cannot update into 0.3.0 (its released script is capturable).
"""

import collections
import glob
import itertools
import re
import subprocess
import unittest

import psycopg

from harness import PG_BIN, Cluster

SETTINGS = {"shared_preload_libraries": "'snowflake'", "snowflake.worker_id": "3"}
MARK = "script-capture:"
TWITTER_EPOCH_MS = 1288834974657  # snowflake.epoch's default

# Argument types of the look-alikes. COMMON: every combination up to three arguments (what a
# literal or an expression of the scripts most likely is); EVERY: each alone, for any arity.
COMMON = ["integer", "bigint", "numeric", "text"]
EVERY = COMMON + ["smallint", "double precision", "real", "oid", "name", "regclass", "boolean",
                  "timestamp with time zone", "timestamp without time zone", "jsonb", "bytea",
                  "anyelement", "anycompatible"]
VARIADIC = ["integer[]", "bigint[]", "numeric[]", "text[]", "anyarray", "anycompatiblearray"]
# Words that the grammar reads before a parenthesis and that never name a function.
SYNTAX = {"in", "as", "values", "table", "exists", "any", "all", "some", "over", "filter", "on",
          "using", "and", "or", "not", "returns", "from", "select", "where", "join", "if",
          "elsif", "when", "then", "else", "loop", "recursive", "with", "check", "unique", "key",
          "references", "by", "into", "union", "return", "raise", "execute", "perform", "lateral",
          "distinct", "array", "row", "coalesce", "nullif", "greatest", "least", "cast"}
# A value of each return type, so that a captured call lets the script go on (and a planted
# snowflake_to_timestamp(integer) records a false epoch, as in the issue).
RETURN_VALUE = {"integer": "0", "bigint": "0", "numeric": "0", "smallint": "0", "real": "0",
                "double precision": "0", "oid": "0", "text": "''", "boolean": "false",
                "timestamp with time zone": "'epoch'", "name": "''", "jsonb": "'{}'"}
OPERATOR_CHARS = set("+-*/<>=~!@#%^&|`?")


def pg_config(flag):
    return subprocess.run([f"{PG_BIN}/pg_config", flag], text=True, capture_output=True,
                          check=True).stdout.strip()


EXTENSION_DIR = f"{pg_config('--sharedir')}/extension"


def quote_ident(name):
    return '"' + name.replace('"', '""') + '"'


def scripts():
    """The text of every script installed for the extension."""
    found = sorted(glob.glob(f"{EXTENSION_DIR}/snowflake--*.sql"))
    assert found, f"no snowflake scripts in {EXTENSION_DIR}"
    texts = {}
    for path in found:
        with open(path) as f:
            texts[path.rsplit("/", 1)[1]] = f.read()
    return texts


def split_code(text):
    """(code, strings): the text with comments and single-quoted strings blanked out, and the
    strings' contents (dynamic SQL is in them)."""
    code, strings, pos = [], [], 0
    for m in re.finditer(r"--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'", text, re.S):
        code.append(text[pos:m.start()])
        if m.group(0).startswith("'"):
            strings.append(m.group(0)[1:-1].replace("''", "'"))
            code.append("''")
        else:
            code.append(" ")
        pos = m.end()
    code.append(text[pos:])
    return "".join(code), strings


CALL = re.compile(r'(?<![\w$"])(\w+|"(?:[^"]|"")+")\s*\(')


def arguments(code, open_paren):
    """The top-level arguments (text) of the call whose '(' is at open_paren."""
    depth, args, current = 0, [], []
    for ch in code[open_paren + 1:]:
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    last = "".join(current).strip()
    return args + [last] if args or last else args  # an unclosed call in a string: so far


def candidate_types(arg):
    """The types a look-alike's parameter may have to match this argument better than the
    real function does: a literal's own type and those it converts to, else COMMON."""
    cast = re.search(r"::\s*([\w.]+(?:\s+\w+)*)\s*$", arg)
    if cast:
        return [cast.group(1)]
    if re.fullmatch(r"-?\d+", arg):
        return ["integer", "bigint", "numeric", "double precision"]
    if re.fullmatch(r"-?\d*\.\d+(e-?\d+)?", arg, re.I):
        return ["numeric", "double precision", "real"]
    if arg == "''":  # a string literal (blanked): unknown, which prefers text
        return ["text"]
    if arg.lower() in ("true", "false"):
        return ["boolean"]
    return COMMON


def calls_and_operators(texts):
    """{name: [argument lists of each call]} of every `name(` (the arguments as written),
    and the set of operator symbols, over all scripts."""
    calls = collections.defaultdict(list)
    operators = set()
    for text in texts:
        code, strings = split_code(text)
        for source in [code] + strings:
            for m in CALL.finditer(source):
                word = m.group(1)
                name = word[1:-1].replace('""', '"') if word.startswith('"') else word.lower()
                if name.lower() in SYNTAX or name.isdigit():
                    continue
                calls[name].append(arguments(source, m.end() - 1))
        for m in re.finditer(r"[+\-*/<>=~!@#%^&|`?]+", re.sub(r"\$\w*\$", " ", code)):
            operators.add(m.group(0))
    return calls, {op for op in operators if valid_operator(op)}


def valid_operator(op):
    """PostgreSQL's rules for an operator name (CREATE OPERATOR)."""
    if not op or len(op) > 63 or "--" in op or "/*" in op or op in ("=>", "::", ":="):
        return False
    if len(op) > 1 and op[-1] in "+-" and not set(op) & set("~!@#%^&|`?"):
        return False
    return set(op) <= OPERATOR_CHARS


def signatures(sites):
    """Argument lists of the look-alikes for a name called with these arguments: for each
    call, every type alone at every position (EVERY), every combination of COMMON up to three
    arguments, and the combinations of what each argument written there may match best;
    and variadic forms."""
    out = set()
    for args in sites:
        n = len(args)
        if n <= 3:
            out.update(itertools.product(COMMON, repeat=n))
        out.update((t,) * n for t in EVERY)
        per_site = list(itertools.islice(itertools.product(*[candidate_types(a) for a in args]), 64))
        out.update(per_site)
    out.update(("VARIADIC " + t,) for t in VARIADIC)
    return out


class Sweep:
    """The look-alikes, derived from the installed scripts once per run."""

    def __init__(self, pg):
        self.texts = scripts()
        self.calls, self.operators = calls_and_operators(self.texts.values())
        # What the real functions return (a look-alike must return the same for the calling
        # expression to parse), and every signature any version of the extension creates
        # (a look-alike with one of those would only make CREATE FUNCTION fail).
        pg.sql("CREATE DATABASE sweep_scratch")
        with pg.connect("sweep_scratch") as c:
            versions = [r[0] for r in c.execute(
                "SELECT version FROM pg_available_extension_versions WHERE name = 'snowflake'")]
            own = set()
            for v in versions:
                c.execute(f"CREATE EXTENSION snowflake VERSION '{v}'")
                own.update(r[0] for r in c.execute(
                    """SELECT p.proname || '(' || pg_catalog.oidvectortypes(p.proargtypes) || ')'
                         FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
                        WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
                          AND d.classid = 'pg_proc'::regclass"""))
                c.execute("DROP EXTENSION snowflake")
            self.own = own
            # Each look-alike's parameter types as PostgreSQL names them (a cast in a script
            # may say pg_catalog.int8); a type that does not exist before the extension does
            # (its own composite types) cannot be planted and is left out.
            wanted = {name: signatures(sites) for name, sites in self.calls.items()}
            spelled = {t.replace("VARIADIC ", "") for sigs in wanted.values() for sig in sigs for t in sig}
            canonical = dict(c.execute("""SELECT t, pg_catalog.to_regtype(t)::text
                                            FROM pg_catalog.unnest(%s::text[]) t""", (sorted(spelled),)))
            self.signatures = {}
            for name, sigs in wanted.items():
                self.signatures[name] = set()
                for sig in sigs:
                    if all(canonical[t.replace("VARIADIC ", "")] for t in sig):
                        self.signatures[name].add(tuple(
                            ("VARIADIC " if t.startswith("VARIADIC ") else "")
                            + canonical[t.replace("VARIADIC ", "")] for t in sig))
            c.execute("CREATE EXTENSION snowflake")
            self.returns = {}
            for name, ret in c.execute(
                    """SELECT p.proname, p.prorettype::regtype::text
                         FROM pg_proc p JOIN pg_type t ON t.oid = p.prorettype
                        WHERE p.proname = ANY(%s) AND t.typnamespace = 'pg_catalog'::regnamespace
                          AND t.typtype IN ('b', 'd', 'e', 'r', 'm') AND t.typrelid = 0
                        ORDER BY p.oid""", (list(self.calls),)):
                self.returns.setdefault(name, ret)
            self.op_returns = {}
            for name, left, right, ret in c.execute(
                    """SELECT o.oprname, o.oprleft::regtype::text, o.oprright::regtype::text,
                              o.oprresult::regtype::text
                         FROM pg_operator o JOIN pg_type t ON t.oid = o.oprresult
                        WHERE o.oprname = ANY(%s) AND o.oprnamespace = 'pg_catalog'::regnamespace
                          AND t.typtype IN ('b', 'd', 'e', 'r', 'm') AND t.typrelid = 0
                        ORDER BY o.oid""",
                    (list(self.operators),)):
                self.op_returns.setdefault((name, left, right), ret)
                self.op_returns.setdefault(name, ret)
        pg.sql("DROP DATABASE sweep_scratch")

    def statements(self, schema, actor):
        """SQL that plants every look-alike in `schema`; each says it ran, records itself in
        <schema>.sweep_calls and makes `actor` a superuser."""
        out = [f"CREATE TABLE {schema}.sweep_calls (what text)"]

        def body(what, ret):
            value = RETURN_VALUE.get(ret, "NULL")
            return (f"LANGUAGE plpgsql AS $sweep$BEGIN "
                    f"RAISE WARNING '{MARK} %', {sql_literal(what)}; "
                    f"INSERT INTO {schema}.sweep_calls VALUES ({sql_literal(what)}); "
                    f"EXECUTE 'ALTER ROLE {actor} SUPERUSER'; "
                    f"RETURN {value}; END$sweep$")

        for name in sorted(self.calls):
            ret = self.returns.get(name, "text")
            for args in sorted(self.signatures[name]):
                plain = ", ".join(a.replace("VARIADIC ", "") for a in args)
                if f"{name}({plain})" in self.own:
                    continue
                what = f"{schema}.{name}({', '.join(args)})"
                out.append(f"CREATE FUNCTION {schema}.{quote_ident(name)}({', '.join(args)}) "
                           f"RETURNS {ret} {body(what, ret)}")
        for k, op in enumerate(sorted(self.operators)):
            pairs = [(left, right) for left in COMMON for right in COMMON]
            pairs += [(None, right) for right in COMMON]  # prefix operators
            for j, (left, right) in enumerate(pairs):
                ret = self.op_returns.get((op, left or "-", right), self.op_returns.get(op, "boolean"))
                fn = f"{schema}.sweep_op_{k}_{j}"
                what = f"{schema}.{op}({left or ''}, {right})"
                args = f"l {left}, r {right}" if left else f"r {right}"
                out.append(f"CREATE FUNCTION {fn}({args}) RETURNS {ret} {body(what, ret)}")
                sides = f"LEFTARG = {left}, RIGHTARG = {right}" if left else f"RIGHTARG = {right}"
                out.append(f"CREATE OPERATOR {schema}.{op} ({sides}, FUNCTION = {fn})")
        return out


def sql_literal(text):
    return "'" + text.replace("'", "''") + "'"


class CaptureCase(unittest.TestCase):
    maxDiff = None
    pg = None
    sweep = None

    @classmethod
    def setUpClass(cls):
        cls.pg = Cluster("script-capture", SETTINGS)
        cls.addClassCleanup(cls.pg.destroy)
        cls.pg.init()
        cls.pg.start()
        cls.pg.sql("CREATE ROLE dbo LOGIN NOSUPERUSER")
        cls.pg.sql("CREATE ROLE mallory LOGIN NOSUPERUSER")
        cls.current = cls.pg.one("SELECT default_version FROM pg_available_extensions WHERE name = 'snowflake'")
        cls.dbs = 0

    def connect(self, user, db):
        return psycopg.connect(host=self.pg.dir, port=self.pg.port, user=user, dbname=db,
                               autocommit=True)

    def new_db(self, owner="postgres", public_for_all=False):
        type(self).dbs += 1
        db = f"capture{self.dbs}"
        self.pg.sql(f"CREATE DATABASE {db} OWNER {owner}")
        if public_for_all:
            # PostgreSQL 14's default (and a cluster upgraded from it): anyone may create in public.
            self.pg.sql("GRANT CREATE ON SCHEMA public TO PUBLIC", dbname=db)
        return db

    def plant(self, user, db, schema):
        with self.connect(user, db) as c, c.transaction():
            # One round trip: a couple of thousand statements.
            c.execute(";\n".join(self.sweep.statements(schema, user)))

    def run_watched(self, user, db, statement):
        """Runs `statement`; returns (error or None, the look-alikes' WARNINGs)."""
        seen = []
        with self.connect(user, db) as c:
            c.add_notice_handler(lambda d: seen.append(d.message_primary or ""))
            try:
                c.execute(statement)
                error = None
            except psycopg.Error as e:
                error = e
        return error, [m for m in seen if m.startswith(MARK)]

    def assertNothingCaptured(self, db, schemas, actor, error, warnings, what):
        """No look-alike ran (its WARNING, or its row if the statement committed), `actor`
        is no superuser, the statement succeeded, and nothing of the extension depends on a
        look-alike (a call resolved into a default or a view would run later, as whoever
        uses it). All of it is reported at once."""
        problems = [f"ran as a superuser: {m[len(MARK):].strip()}" for m in warnings]
        for schema in schemas:
            problems += [f"recorded a call: {r[0]}" for r in
                         self.pg.sql(f"SELECT what FROM {schema}.sweep_calls", dbname=db)]
        if self.pg.one(f"SELECT rolsuper FROM pg_roles WHERE rolname = '{actor}'"):
            problems.append(f"{actor} became a superuser")
        if error is not None:
            problems.append(f"failed: {error.sqlstate} {error}")
        else:
            ext_schema = self.pg.sql("""SELECT extnamespace::regnamespace::text FROM pg_extension
                                         WHERE extname = 'snowflake'""", dbname=db)[0][0]
            epoch = self.pg.sql(f"SELECT epoch_unix_ms FROM {ext_schema}.snowflake_origin", dbname=db)
            if epoch != [(TWITTER_EPOCH_MS,)]:
                problems.append(f"snowflake_origin records the epoch {epoch}")
        problems += [f"depends on a look-alike: {r[0]}" for r in self.pg.sql(
            """SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' -> ' ||
                      pg_describe_object(d.refclassid, d.refobjid, d.refobjsubid)
                 FROM pg_depend d
                 LEFT JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
                 LEFT JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass AND o.oid = d.refobjid
                WHERE COALESCE(p.pronamespace, o.oprnamespace) = ANY(%s::regnamespace[])
                  AND d.deptype = 'n' AND d.classid <> 'pg_operator'::regclass
                  AND NOT EXISTS (SELECT FROM pg_depend m
                                   WHERE m.classid = d.refclassid AND m.objid = d.refobjid
                                     AND m.deptype = 'e')""",
            (list(schemas),), dbname=db)]
        self.assertEqual(problems, [], f"{what}:\n  " + "\n  ".join(problems))

    def reset_roles(self):
        for role in ("dbo", "mallory"):
            self.pg.sql(f"ALTER ROLE {role} NOSUPERUSER")


class CaptureSweep(CaptureCase):
    """Every call of every shipped script against look-alikes of every argument-type variant."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.sweep = Sweep(cls.pg)

    def setUp(self):
        self.reset_roles()

    def test_sweep_covers_the_known_capture(self):
        # The sweep is derived from the scripts: the call of the issue is among them, with the
        # look-alike that captured it.
        self.assertIn(["0"], self.sweep.calls["snowflake_to_timestamp"])
        plants = "\n".join(self.sweep.statements("public", "dbo"))
        self.assertIn('CREATE FUNCTION public."snowflake_to_timestamp"(integer) RETURNS timestamp with time zone',
                      plants)
        self.assertIn("CREATE OPERATOR public.* (LEFTARG = numeric, RIGHTARG = integer", plants)

    def test_install_as_database_owner_in_public(self):
        db = self.new_db(owner="dbo")
        self.plant("dbo", db, "public")
        error, warnings = self.run_watched("dbo", db, "CREATE EXTENSION snowflake")
        self.assertNothingCaptured(db, ["public"], "dbo", error, warnings, "trusted CREATE EXTENSION")

    def test_install_as_database_owner_in_its_schema(self):
        db = self.new_db(owner="dbo")
        with self.connect("dbo", db) as c:
            c.execute("CREATE SCHEMA dbo_ext")
        self.plant("dbo", db, "public")
        self.plant("dbo", db, "dbo_ext")
        error, warnings = self.run_watched("dbo", db, "CREATE EXTENSION snowflake SCHEMA dbo_ext")
        self.assertNothingCaptured(db, ["public", "dbo_ext"], "dbo", error, warnings,
                                   "trusted CREATE EXTENSION SCHEMA dbo_ext")

    def test_install_by_superuser_with_public_writable_by_all(self):
        db = self.new_db(public_for_all=True)
        self.plant("mallory", db, "public")
        error, warnings = self.run_watched("postgres", db, "CREATE EXTENSION snowflake")
        self.assertNothingCaptured(db, ["public"], "mallory", error, warnings,
                                   "a superuser's CREATE EXTENSION, public writable by all")

    def update_sources(self):
        rows = self.pg.sql("""SELECT source, path FROM pg_extension_update_paths('snowflake')
                               WHERE target = %s AND path IS NOT NULL ORDER BY source""",
                           (self.current,))
        self.assertGreaterEqual(len(rows), 6, rows)
        return rows

    def test_update_by_owner_from_every_version(self):
        for source, path in self.update_sources():
            with self.subTest(source=source, path=path):
                self.reset_roles()
                db = self.new_db(owner="dbo")
                self.pg.sql(f"CREATE EXTENSION snowflake VERSION '{source}'", dbname=db)
                # As installed by its database owner while earlier versions were trusted.
                self.pg.sql("UPDATE pg_extension SET extowner = 'dbo'::regrole WHERE extname = 'snowflake'",
                            dbname=db)
                self.plant("dbo", db, "public")
                error, warnings = self.run_watched("dbo", db, "ALTER EXTENSION snowflake UPDATE")
                self.assertNothingCaptured(db, ["public"], "dbo", error, warnings,
                                           f"the owner's ALTER EXTENSION UPDATE from {source} ({path})")
                self.assertEqual(self.pg.sql("SELECT extversion FROM pg_extension WHERE extname = 'snowflake'", dbname=db),
                                 [(self.current,)])

    def test_update_by_superuser_with_public_writable_by_all(self):
        for source, path in self.update_sources():
            with self.subTest(source=source, path=path):
                self.reset_roles()
                db = self.new_db(public_for_all=True)
                self.pg.sql(f"CREATE EXTENSION snowflake VERSION '{source}'", dbname=db)
                self.plant("mallory", db, "public")
                error, warnings = self.run_watched("postgres", db, "ALTER EXTENSION snowflake UPDATE")
                self.assertNothingCaptured(db, ["public"], "mallory", error, warnings,
                                           f"a superuser's ALTER EXTENSION UPDATE from {source} ({path})")


class EarlierVersions(CaptureCase):
    """Earlier versions are for superusers only."""

    def test_database_owner_cannot_install_an_earlier_version(self):
        db = self.new_db(owner="dbo")
        versions = [r[0] for r in self.pg.sql(
            "SELECT version FROM pg_available_extension_versions WHERE name = 'snowflake' AND version <> %s",
            (self.current,))]
        self.assertGreaterEqual(len(versions), 6, versions)
        with self.connect("dbo", db) as c:
            for v in versions:
                with self.subTest(version=v):
                    try:
                        c.execute(f"CREATE EXTENSION snowflake VERSION '{v}'")
                    except psycopg.Error as e:
                        self.assertEqual(e.sqlstate, "42501", str(e))
                        self.assertIn('permission denied to create extension "snowflake"', str(e))
                        self.assertEqual(e.diag.message_hint, "Must be superuser to create this extension.")
                    else:
                        c.execute("DROP EXTENSION snowflake")
                        self.fail(f"a database owner installed version {v}")
            # The current version stays installable by the database owner (trusted).
            c.execute("CREATE EXTENSION snowflake")

    def test_owner_cannot_update_into_the_capturable_version(self):
        db = self.new_db(owner="dbo")
        self.pg.sql("CREATE EXTENSION snowflake VERSION '0.2.0'", dbname=db)
        self.pg.sql("UPDATE pg_extension SET extowner = 'dbo'::regrole WHERE extname = 'snowflake'", dbname=db)
        with self.connect("dbo", db) as c:
            try:
                c.execute("ALTER EXTENSION snowflake UPDATE TO '0.3.0'")
            except psycopg.Error as e:
                self.assertEqual(e.sqlstate, "42501", str(e))
                self.assertIn('permission denied to update extension "snowflake"', str(e))
                self.assertEqual(e.diag.message_hint, "Must be superuser to update this extension.")
            else:
                self.fail("the owner updated into 0.3.0")
            # PostgreSQL's own path from 0.2.0 skips 0.3.0 and the owner may take it.
            path = c.execute("""SELECT path FROM pg_extension_update_paths('snowflake')
                                 WHERE source = '0.2.0' AND target = %s""", (self.current,)).fetchone()[0]
            self.assertNotIn("0.3.0", path.split("--"))
            c.execute("ALTER EXTENSION snowflake UPDATE")


if __name__ == "__main__":
    unittest.main(verbosity=2)
