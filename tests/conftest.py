"""Shared pytest configuration: every async test runs under Trio (trio_mode in pyproject)."""
