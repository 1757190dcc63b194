"""Tools that find where the time goes (profiles, phase breakdowns, CPU budgets, instruction
counts): one line each in ``README.md``."""
