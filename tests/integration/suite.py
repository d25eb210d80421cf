"""The whole integration suite of one major, as `python3 -m unittest discover -v -p
'test_*.py'` runs it, which also writes how long each test module took to
SNOWFLAKE_IT_BASE/durations.tsv (seconds, then the module). The test command prints the
slowest modules of each major at the end of the run, so that its time budget
(docs/testing.md) is watched with figures and not guessed. A module's time runs from the end
of the test before its first one, so its classes' setUpClass are in it."""

import os
import sys
import time
import unittest
from collections import defaultdict


class TimedResult(unittest.TextTestResult):
    """Adds each test's wall time, since the previous test ended, to its module."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds = defaultdict(float)
        self.last_end = time.monotonic()

    def stopTest(self, test):
        super().stopTest(test)
        now = time.monotonic()
        # A module that fails to import is a test of unittest.loader: name it as such.
        self.seconds[test.id().split(".")[0]] += now - self.last_end
        self.last_end = now


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    suite = unittest.defaultTestLoader.discover(here, pattern="test_*.py", top_level_dir=here)
    # As unittest.main: warnings shown once each unless -W said otherwise.
    result = unittest.TextTestRunner(verbosity=2, resultclass=TimedResult,
                                     warnings=None if sys.warnoptions else "default").run(suite)
    base = os.environ.get("SNOWFLAKE_IT_BASE")
    if base:
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, "durations.tsv"), "w") as f:
            for module, seconds in sorted(result.seconds.items(), key=lambda kv: -kv[1]):
                f.write(f"{seconds:.0f}\t{module}\n")
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
