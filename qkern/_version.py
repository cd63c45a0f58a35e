"""The version of qkern, one place for the package and the tuning files."""

__version__ = "0.1.0"
