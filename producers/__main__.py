"""`python -m producers` runs the sensor-sim CLI."""

import sys

from producers.cli import main

if __name__ == "__main__":  # not when a --workers process (multiprocessing's spawn) imports it again
    sys.exit(main())
