import sys

from speechrt.cli import main

sys.exit(main())
