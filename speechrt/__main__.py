"""`python -m speechrt`: the `speechrt` command."""

import sys

from speechrt.cli import main

sys.exit(main())
