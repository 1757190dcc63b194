"""``python -m bench.sql_breadth``: the benchmark of ``run.py``."""

import sys

from bench.sql_breadth.run import main

sys.exit(main())
