"""Errors a user can cause, mapped to the CLI's exit codes (docs/contract.md)."""

from __future__ import annotations


class InvalidInput(ValueError):
    """Bad input: exit code 2, nothing changed."""

    exit_code = 2


class Refused(RuntimeError):
    """Refused by a rule, nothing changed: exit code 3."""

    exit_code = 3
