"""scripts/check-errors.py's door rule (only the functions PostgreSQL calls raise) fed copies
of src/ with one violation planted each: it must report every one, and pass the copy with
none. A rule that never fails would let errors leave from anywhere again (issue 39). No
server: it runs in about a second."""

import importlib.util
import shutil
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("check_errors", ROOT / "scripts/check-errors.py")
check_errors = importlib.util.module_from_spec(SPEC)
sys.modules["check_errors"] = check_errors  # its dataclasses look their module up there
SPEC.loader.exec_module(check_errors)

# (what, file, the text it is planted before, the planted text)
PLANTS = [
    ("a raise in a helper", "src/generation/lease.rs", "pub(crate) fn recorded_state(",
     "fn planted(e: SnowflakeError) { e.raise(\"f\"); }\n"),
    ("or_raise in a helper", "src/generation/lease.rs", "pub(crate) fn recorded_state(",
     "fn planted(r: errors::Result<()>) { r.or_raise(\"f\"); }\n"),
    ("raise called as a path", "src/generation/lease.rs", "pub(crate) fn recorded_state(",
     "fn planted(e: SnowflakeError) { SnowflakeError::raise(e, \"f\"); }\n"),
    ("or_raise called as a path", "src/generation/lease.rs", "pub(crate) fn recorded_state(",
     "fn planted(r: errors::Result<()>) { OrRaise::or_raise(r, \"f\"); }\n"),
    ("an ErrorReport at ERROR", "src/generation/lease.rs", "pub(crate) fn recorded_state(",
     "fn planted() { ErrorReport::new(C, \"x\", \"f\").report(PgLogLevel::ERROR); }\n"),
    ("pgrx's error macro", "src/generation/lease.rs", "pub(crate) fn recorded_state(",
     "fn planted() { pgrx::error!(\"x\"); }\n"),
    ("pgrx's error macro imported under another name", "src/generation/lease.rs",
     "pub(crate) fn recorded_state(", "use pgrx::error as fail;\n"),
    ("a helper of the SQL functions' module", "src/functions/decode.rs",
     "pub(crate) fn decoded(", "fn planted(e: errors::SnowflakeError) { e.raise(\"x\"); }\n"),
    ("a restricted fn after an entry point", "src/generation/wal.rs",
     "#[pg_guard]\nunsafe extern \"C-unwind\" fn desc(",
     "pub(in crate::generation) fn planted(e: SnowflakeError) { e.raise(\"x\"); }\n"),
    ("an extern fn PostgreSQL does not call", "src/generation/wal.rs",
     "#[pg_guard]\nunsafe extern \"C-unwind\" fn desc(",
     "extern \"C-unwind\" fn planted(e: SnowflakeError) { e.raise(\"x\"); }\n"),
]


class DoorRule(unittest.TestCase):
    def setUp(self):
        self.root = Path(tempfile.mkdtemp(prefix="check-errors-"))
        self.addCleanup(shutil.rmtree, self.root)

    def fresh_src(self):
        """The copy of src/ as it is in the repository."""
        shutil.rmtree(self.root / "src", ignore_errors=True)
        shutil.copytree(ROOT / "src", self.root / "src")

    def plant(self, rel, before, text):
        path = self.root / rel
        body = path.read_text()
        self.assertIn(before, body, f"{rel} no longer has {before!r}: update the plant")
        path.write_text(body.replace(before, text + before, 1))

    def test_the_tree_as_it_is_passes(self):
        self.fresh_src()
        self.assertEqual(check_errors.check_doors(self.root), [])

    def test_every_planted_raise_is_reported(self):
        for what, rel, before, text in PLANTS:
            with self.subTest(what):
                self.fresh_src()
                self.plant(rel, before, text)
                problems = check_errors.check_doors(self.root)
                self.assertEqual(len(problems), 1, problems)
                self.assertTrue(problems[0].startswith(rel + ":"), problems)


if __name__ == "__main__":
    unittest.main()
