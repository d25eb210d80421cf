#!/usr/bin/env bash
# The release rule, checked: a released SQL script is never edited, and every released
# version can be updated to the current one.
#   - sql/released.sha256 pins the checksum of every released script in sql/;
#   - from every released version there is a chain of sql/snowflake--A--B.sql scripts to the
#     version in Cargo.toml;
#   - earlier versions are for superusers only: every install script of an earlier version
#     (sql/snowflake--V.sql; every earlier version is installed from one) has a secondary
#     control file sql/snowflake--V.control with trusted = false;
#   - a released script that can be captured (UNSAFE below: a call a look-alike overload can
#     take over, run as the bootstrap superuser in a trusted install or update) is never on a
#     path PostgreSQL takes to the current version (it takes a shortest one: a direct script
#     skips the unsafe one), and the step into its target version needs a superuser
#     (trusted = false); no path PostgreSQL may take to the current version steps into a
#     version marked trusted = false (the extension's owner could not update).
# At a release: add the new upgrade script's checksum to sql/released.sha256.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$REPO_ROOT/sql"

sha256sum --quiet --strict -c released.sha256
current="$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO_ROOT/Cargo.toml" | head -1)"

# Every version that appears in a released script name.
versions="$(awk '{print $2}' released.sha256 | sed -n 's/^snowflake--\(.*\)\.sql$/\1/p' | tr -s '-' '\n' | sort -u)"
for v in $versions; do
    at="$v"
    for _ in $(seq 1 50); do
        [ "$at" = "$current" ] && break
        next="$(ls snowflake--"$at"--*.sql 2>/dev/null | sed -n "s/^snowflake--$at--\(.*\)\.sql$/\1/p" | sort -V | tail -1)"
        if [ -z "$next" ]; then
            echo "check-released: no upgrade path from $v to $current (stuck at $at)" >&2
            exit 1
        fi
        at="$next"
    done
done

# Released scripts that a look-alike overload can capture (docs/upgrades.md): 0.2.0 -> 0.3.0
# calls snowflake_to_timestamp(0), an integer argument (issue 35).
UNSAFE="snowflake--0.2.0--0.3.0.sql"
CURRENT="$current" UNSAFE="$UNSAFE" /usr/bin/python3 - <<'PY'
import collections, glob, os, re, sys

current, unsafe = os.environ["CURRENT"], os.environ["UNSAFE"].split()
def fail(msg):
    sys.exit(f"check-released: {msg}")
def untrusted(v):
    try:
        text = open(f"snowflake--{v}.control").read()
    except FileNotFoundError:
        return False
    return re.search(r"^\s*trusted\s*=\s*'?false'?\s*$", text, re.M) is not None

edges = collections.defaultdict(set)
installs = []
for f in glob.glob("snowflake--*.sql"):
    parts = f[len("snowflake--"):-len(".sql")].split("--")
    if len(parts) == 2:
        edges[parts[0]].add(parts[1])
    else:
        installs.append(parts[0])
for v in installs:
    if v != current and not untrusted(v):
        fail(f"version {v} has an install script but no snowflake--{v}.control with trusted = false")

def dist_from(start):
    d, todo = {start: 0}, collections.deque([start])
    while todo:
        a = todo.popleft()
        for b in edges[a]:
            if b not in d:
                d[b] = d[a] + 1
                todo.append(b)
    return d
to_current = {v: dist_from(v).get(current) for v in list(edges)}
to_current[current] = 0
for start in list(edges):
    total = to_current[start]
    if total is None:
        continue
    d = dist_from(start)
    # Steps (a, b) on some shortest path: PostgreSQL may take any of them.
    for a in d:
        for b in edges[a]:
            if to_current.get(b) is not None and d[a] + 1 + to_current[b] == total:
                script = f"snowflake--{a}--{b}.sql"
                if script in unsafe:
                    fail(f"the update from {start} to {current} may run {script}, which can be captured: add a direct script that skips it")
                if untrusted(b):
                    fail(f"the update from {start} to {current} steps into {b}, which is for superusers only")
for script in unsafe:
    target = script[:-len(".sql")].split("--")[2]
    if not untrusted(target):
        fail(f"{script} can be captured, but snowflake--{target}.control does not make the step a superuser's")
PY
echo "check-released: released scripts unchanged; every released version updates to $current;" \
    "earlier versions are for superusers; no update to $current runs a capturable script"
