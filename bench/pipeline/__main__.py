"""``python -m bench.pipeline``: the benchmark of ``run.py``."""

import sys

from bench.pipeline.run import main

sys.exit(main())
