"""The chaos campaign: a node's processes, found and signalled."""

import glob
import os

from fixtures.processes import alive, kill_server


def procs_in(datadir):
    """Pids of the processes whose working directory is `datadir` (every PostgreSQL process
    of that server chdirs there), including ones forked after a pgrep would have run."""
    real = os.path.realpath(datadir)
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            if os.readlink(f"{d}/cwd") == real:
                found.append(int(d[6:]))
        except OSError:
            pass
    return [p for p in found if alive(p)]


def signal_node(c, sig):
    """fixtures.processes.kill_server (the postmaster, then its children), then every other
    process of the server (a child forked meanwhile, or one gone before its signal)."""
    try:
        pids = kill_server(c, sig)
    except (OSError, ValueError):
        pids = []
    more = [p for p in procs_in(c.data) if p not in pids]
    for p in more:
        send(p, sig)
    return pids + more


def send(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def is_postgres(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"postgres" in f.read()
    except OSError:
        return False
