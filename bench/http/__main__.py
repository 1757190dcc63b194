"""``python -m bench.http``: the benchmark of ``run.py``."""

import sys

from bench.http.run import main

sys.exit(main())
