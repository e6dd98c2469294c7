"""``python -m isiwatch.cli``: the same command line as ``isiwatch``."""

import sys

from .commands import main

sys.exit(main())
