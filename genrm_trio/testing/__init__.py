"""Test support for users and our own suite: the fake judge, fixtures and instruments."""
