"""`python -m railmq ...`: the same command line as the installed `railmq` script."""

import sys

from railmq.cli import main

sys.exit(main())
