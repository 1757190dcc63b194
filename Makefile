# The two set-up commands of the README: `make demo` and `make test`. Each builds the
# environment first if needed (scripts/bootstrap.sh is a no-op when it is up to date).
.PHONY: env demo test lint format bench clean

env:
	@bash scripts/bootstrap.sh

# make demo KEEP=1: the cluster stays up at the end (its console URL is printed)
demo: env
	@bash scripts/demo.sh $(if $(KEEP),--keep)

test: env
	@.venv/bin/ruff check src tests bench
	@.venv/bin/lint-imports --no-cache
	@.venv/bin/python -m pytest

lint: env
	@.venv/bin/ruff check src tests bench
	@.venv/bin/ruff format --check src tests bench
	@.venv/bin/lint-imports --no-cache

format: env
	@.venv/bin/ruff format src tests bench

bench: env
	@.venv/bin/python -m bench --quick

clean:
	rm -rf .venv .pytest_cache demo-cluster
