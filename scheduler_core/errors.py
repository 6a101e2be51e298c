"""Errors that reach a user: each names the field (or file, line, column) and the reason."""

from __future__ import annotations


class InputError(Exception):
    """Bad input from a user: a scenario, a trace file, a command-line value.

    ``where`` names the field (``requests[3].gpus``) or the place in a file
    (``pods.csv:12:num_gpu``); ``reason`` says what is wrong with it. The CLI
    prints ``str(error)`` as one line and exits with status 2.
    """

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason
