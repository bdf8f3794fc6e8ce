"""Shared pytest configuration: every async test runs under Trio (trio_mode in pyproject).

The Redis fixtures (a real server per test or per module) are available to every test.
"""

pytest_plugins = ["genrm_trio.testing.redis_fixtures"]
