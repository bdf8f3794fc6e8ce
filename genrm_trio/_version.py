"""The package's version, in a module of its own so that any module can name it without
loading the package's public face."""

__version__ = "0.1.0"
