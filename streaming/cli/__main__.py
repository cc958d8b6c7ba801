"""`python -m streaming.cli`: the same as `iotlake`."""

import sys

from streaming.cli import main

sys.exit(main())
