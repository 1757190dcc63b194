"""``python -m bench.scan``: the benchmark of ``run.py``."""

import sys

from bench.scan.run import main

sys.exit(main())
