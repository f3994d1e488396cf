"""``python -m harness``: see harness.cli."""

import sys

from .cli import main

sys.exit(main())
