"""``python -m attnbook ...``: the command line of :mod:`attnbook.cli`."""

import sys

from .cli import main

sys.exit(main())
