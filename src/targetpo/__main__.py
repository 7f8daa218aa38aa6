"""`python -m targetpo`: the same command as the `targetpo` script."""

import sys

from targetpo.cli import main

sys.exit(main())
