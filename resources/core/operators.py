"""Who may do what: the operators' allow-list and roles (``DUELEDGER_OPERATORS``).

Roles, each including the ones before it:

- ``viewer``: ``runs list``, ``runs show``, ``summary``;
- ``retrier``: also ``runs retry`` and ``launch``;
- ``admin``: also ``--acknowledge-side-effects`` (retrying a ``dispatch_failed`` or
  ``lease_reclaimed`` entry, whose earlier run may have had side effects).

The allow-list is a TOML file named by ``DUELEDGER_OPERATORS``::

    [operators]
    alice = ["admin"]
    bob = ["retrier"]
    carol = ["viewer"]
    dagster-ui = ["retrier"]   # re-executions started from the Dagster UI

When no file is configured (the variable is unset or empty) there is a single local
operator with all roles: any ``--operator`` name is accepted and recorded as given. That is
the local, one-person default; a deployment shared by several people sets the variable to
an existing file. A variable that names a file which does not exist is an error, never the
local default: a typo in the path must not give every name every role (fail closed).

Pure: parsing and role checks do no I/O besides reading that one file.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from resources.core.config_files import ConfigFileError, read_config_file
from resources.core.settings import ENV_OPERATORS, SettingsError
from resources.core.text import printable

ROLE_VIEWER: Final = "viewer"
ROLE_RETRIER: Final = "retrier"
ROLE_ADMIN: Final = "admin"
#: Lowest to highest; a role grants every role before it.
ROLES: Final = (ROLE_VIEWER, ROLE_RETRIER, ROLE_ADMIN)

#: The operator of re-executions started from the Dagster UI (the OSS UI has no login).
UI_OPERATOR: Final = "dagster-ui"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")


class OperatorsFileError(SettingsError):
    """The operators file cannot be read or is not in the documented format (exit 2)."""


def implied_roles(roles: frozenset[str] | set[str]) -> frozenset[str]:
    """``roles`` plus every role below the highest one given."""
    top = max((ROLES.index(r) for r in roles), default=-1)
    return frozenset(ROLES[: top + 1])


@dataclass(frozen=True)
class Decision:
    """The outcome of one role check, as recorded in audit records."""

    name: str
    passed: bool
    detail: str

    def as_json(self) -> dict[str, object]:
        return {"check": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True)
class Operators:
    """The allow-list in force. ``local`` means no file: one local operator, all roles."""

    source: str
    local: bool
    roles: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def roles_of(self, name: str) -> frozenset[str] | None:
        """The (implied) roles of ``name``; None when the name is not on the list."""
        if self.local:
            return frozenset(ROLES)
        return self.roles.get(name)

    def check(self, name: str, role: str) -> Decision:
        """May ``name`` act with ``role``? The decision names the file and the fix."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles are {', '.join(ROLES)}")
        check_name = f"operator_has_role_{role}"
        if self.local:
            return Decision(check_name, True, f"single local operator ({self.source})")
        roles = self.roles.get(name)
        if roles is None:
            return Decision(
                check_name,
                False,
                f"operator {name!r} is not on the allow-list in {self.source}; "
                f"add them under [operators] with the roles they need",
            )
        if role not in roles:
            held = ", ".join(r for r in ROLES if r in roles) or "none"
            return Decision(
                check_name,
                False,
                f"operator {name!r} has roles [{held}] in {self.source}; "
                f"{role!r} (or higher) is needed",
            )
        return Decision(check_name, True, f"operator {name!r} has role {role!r}")


def parse_operators(text: str, source: str) -> Operators:
    """Parse the TOML allow-list (see module docstring); errors name the file and entry."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise OperatorsFileError(f"operators file {source} is not valid TOML: {exc}") from None
    table = data.get("operators")
    if not isinstance(table, dict):
        raise OperatorsFileError(
            f"operators file {source} needs an [operators] table, e.g. "
            f'[operators] alice = ["admin"]'
        )
    unknown_keys = sorted(set(data) - {"operators"})
    if unknown_keys:
        raise OperatorsFileError(
            f"operators file {source}: unknown top-level keys {unknown_keys}; "
            f"only [operators] is read"
        )
    roles: dict[str, frozenset[str]] = {}
    for name, given in table.items():
        if not _NAME.match(name):
            raise OperatorsFileError(
                f"operators file {source}: operator name {name!r} must be 1-200 characters "
                f"of letters, digits and . _ @ + - (starting with a letter or digit)"
            )
        if not isinstance(given, list) or not given or not all(isinstance(r, str) for r in given):
            raise OperatorsFileError(
                f"operators file {source}: {name} = {given!r} must be a non-empty list of "
                f'roles, e.g. {name} = ["retrier"]'
            )
        bad = [r for r in given if r not in ROLES]
        if bad:
            raise OperatorsFileError(
                f"operators file {source}: {name} has unknown roles {bad}; "
                f"roles are {', '.join(ROLES)}"
            )
        roles[name] = implied_roles(set(given))
    return Operators(source=source, local=False, roles=roles)


def load_operators(path: str | None) -> Operators:
    """The allow-list from ``path``; no path: the single local operator.

    A path to a file that does not exist raises :class:`OperatorsFileError` (fails closed).
    """
    if not path or not path.strip():
        return Operators(source=f"{ENV_OPERATORS} not set", local=True)
    file = Path(path).expanduser()
    try:
        text = read_config_file(file, f"{ENV_OPERATORS}={printable(path)}")
    except FileNotFoundError:
        raise OperatorsFileError(
            f"{ENV_OPERATORS}={printable(path)} names a file that does not exist; create the "
            f"allow-list there (docs/operators.md) or unset {ENV_OPERATORS} for the single "
            f"local operator"
        ) from None
    except ConfigFileError as exc:
        raise OperatorsFileError(
            f"{exc}; the allow-list must be a UTF-8 TOML file (docs/operators.md)"
        ) from None
    return parse_operators(text, printable(str(file)))


def operators_from_env(environ: Mapping[str, str] | None = None) -> Operators:
    """The allow-list this process runs under (re-read on every call: edits apply at once)."""
    # settings.py has no field for this variable yet; read here, alone, by the same name.
    env = os.environ if environ is None else environ
    return load_operators(env.get(ENV_OPERATORS))


def check_operator_name(name: str, what: str = "--operator") -> str:
    """A usable operator name, stripped; InvalidInput-worthy problems raise ValueError
    naming ``what`` (the flag, or ``DUELEDGER_IDENTITY`` for the caller's identity)."""
    text = (name or "").strip()
    if not text:
        raise ValueError(f"{what} must name who acts (it is recorded in the audit)")
    if not _NAME.match(text):
        raise ValueError(
            f"{what} {name!r} must be 1-200 characters of letters, digits and . _ @ + - "
            f"(starting with a letter or digit)"
        )
    return text
