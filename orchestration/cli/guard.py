"""Roles for the operations commands that change something: `sample-data`, `reclaim` and
`liveness --alert` (docs/operators.md, "Roles").

With an operators allow-list (``DUELEDGER_OPERATORS``) the caller -- ``DUELEDGER_IDENTITY``
or the OS login, as for every command -- needs a role: ``retrier`` to reclaim expired
leases, to deliver liveness alerts and to generate sample data into an empty store,
``admin`` for ``sample-data --replace`` (it deletes the store's data). A refusal is exit 3
with an audit record, like ``runs retry``; a command that acts writes one too, saying what
it did. Without an allow-list (the local, one-person default) nothing is checked or audited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from orchestration.cli.runs import acting_operator, load_operators, require_role
from orchestration.cli.support import open_ledger
from resources.core.operators import Decision
from resources.core.settings import Settings
from resources.ledger import Ledger

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

ACTION_RECLAIM: Final = "reclaim"
ACTION_LIVENESS_ALERT: Final = "liveness_alert"
ACTION_SAMPLE_DATA: Final = "sample_data"
ACTION_SAMPLE_DATA_REPLACE: Final = "sample_data_replace"


@dataclass(frozen=True)
class Grant:
    """The role check a command passed: who acts (None: no allow-list, nothing audited)."""

    ledger: Ledger | None
    operator: str | None
    action: str
    role: str

    @property
    def audited(self) -> bool:
        """An allow-list is in force: what the command does is audited."""
        return self.ledger is not None and self.operator is not None

    def audit(
        self, outcome: str, *, entry_id: int | None = None, connection: Connection | None = None
    ) -> None:
        """Record what the command did, under the operator it ran as (allow-list only); with
        ``connection``, in the transaction of the change it records."""
        if self.ledger is None or self.operator is None:
            return
        check = Decision(
            f"operator_has_role_{self.role}",
            True,
            f"operator {self.operator!r} has role {self.role!r}",
        )
        self.ledger.write_audit(
            operator=self.operator,
            action=self.action,
            entry_id=entry_id,
            checks=[check.as_json()],
            outcome=outcome,
            connection=connection,
        )


def require_command_role(
    settings: Settings, action: str, role: str, *, ledger: Ledger | None = None
) -> Grant:
    """Refuse (exit 3, audited) unless the caller holds ``role`` under the allow-list; no
    allow-list: allowed, as before. Runs before the command changes anything."""
    operators = load_operators()
    if operators.local:
        return Grant(None, None, action, role)
    ledger = ledger if ledger is not None else open_ledger(settings)
    name = acting_operator(ledger, operators, None, action=action)
    require_role(ledger, operators, name, role, action=action)
    return Grant(ledger, name, action, role)
