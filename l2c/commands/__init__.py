"""Subcommands of the `l2c` CLI, one module each (see l2c/cli.py)."""
