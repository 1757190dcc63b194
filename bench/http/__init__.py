"""The N1QL query service over HTTP against the Python client and PostgreSQL (``python -m
bench.http``): the HTTP wire's runner (``clients.py``) over ``bench.sql``'s query mix and
phases, run by ``run.py``."""
