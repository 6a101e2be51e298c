"""Subcommands of the `budgethub` CLI, one module each (see cli.py)."""
