"""dualtrain's version, at the bottom of the package so that any module may record it (run
records, the environment facts, the report) without importing the package root."""

__version__ = "0.1.0"
