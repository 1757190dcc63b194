"""Test support shipped with the package: invariant checkers, in-memory fakes and harness
pieces used by the test suites and the simulator's scenarios. Never imported by a service."""
