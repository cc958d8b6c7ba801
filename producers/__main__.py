"""`python -m producers` runs the sensor-sim CLI."""

import sys

from producers.cli import main

sys.exit(main())
