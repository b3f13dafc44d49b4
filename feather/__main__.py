"""`python -m feather`: the same command line as the `feather` script."""

import sys

from feather.cli import main

sys.exit(main())
