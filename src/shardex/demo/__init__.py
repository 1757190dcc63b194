"""Demo helpers: a realistic, deterministic data set for ``scripts/demo.sh``."""
