"""python3 -m chaos: the campaign from the command line (see the package's docstring)."""

import sys

from .campaign import main

sys.exit(main())
