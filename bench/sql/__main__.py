"""``python -m bench.sql``: the benchmark of ``run.py``."""

import sys

from bench.sql.run import main

sys.exit(main())
