"""``python -m isiwatch``: the same command line as ``isiwatch``."""

import sys

from .cli.commands import main

sys.exit(main())
