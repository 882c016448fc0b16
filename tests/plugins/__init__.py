"""Throw-away plug-ins for tests/test_plugins.py: each is one module and one registry line."""
