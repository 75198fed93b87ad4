"""Entry point for `python -m kvstrata`."""

import sys

from kvstrata.cli import main

sys.exit(main())
