"""The package's version: its one source (pyproject.toml reads it, and the helpers send it in the
"jobbroker-client" call metadata)."""

__version__ = "0.1.0"
