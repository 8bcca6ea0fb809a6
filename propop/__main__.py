"""``python -m propop``: the same as the ``propop`` command."""

import sys

from .cli import main

sys.exit(main())
