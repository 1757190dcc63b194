"""shardex's tests. A package, as are ``tests/unit`` and ``tests/integration``: their modules
have one import name each (``tests.unit.core.test_keycodec``), so a test that imports a
helper or another test module gets the module pytest collected, not a second copy, and two
folders may hold files of the same name."""
