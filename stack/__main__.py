"""`python -m stack ...`: see stack.cli."""

import sys

from stack.cli import main

sys.exit(main())
