"""The hosting domain's business rules as validated configuration.

`DomainRules` is a Dagster resource holding every tunable of the billing, auto-renew,
ticket and log-archive rules, with the seed's defaults. It is validated when it is
constructed -- at definition load for the values in `domain_resources()` below, and at
run start for values given as run config in the launchpad -- by building the pure
policy objects the rules use (``assets.tunables``, free of pandas: validating them does
not load the rules), so a bad value (negative day, unknown channel) fails with a message
naming the field and the fix, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import dagster as dg
from pydantic import Field, model_validator

from assets.tunables import (
    ARCHIVE_FORMAT,
    ArchivePolicy,
    AutoRenewPolicy,
    ReminderPolicy,
    TicketAutoClosePolicy,
)
from resources.core.settings import load_settings
from resources.source_schema import CHANNELS

_T = TypeVar("_T")

#: Sub-directory of DAGSTER_HOME used for archives when `archive_dir` is not set.
DEFAULT_ARCHIVE_SUBDIR = "log_archives"


class DomainRulesError(ValueError):
    """A business-rule setting is invalid; the message names the setting and the fix."""


class DomainRules(dg.ConfigurableResource):
    """Reminder days, channels, renewal window, ticket wait and log retention.

    Register as ``DomainRules()`` for the defaults, or override fields, e.g.
    ``DomainRules(overdue_reminder_days=[2, 7], channels=["email"])``.
    """

    overdue_reminder_days: list[int] = Field(
        default=[1, 3, 5], description="Days after an invoice's due date to send reminders."
    )
    renewal_notice_days: list[int] = Field(
        default=[7, 3, 1], description="Days before a service expires to send renewal notices."
    )
    channels: list[str] = Field(
        default=list(CHANNELS),
        description=f"Channels reminders may use (subset of {list(CHANNELS)}); each customer "
        "still only gets the channels they opted into.",
    )
    auto_renew_window_days: int = Field(
        default=3, description="Renew auto-renew services this many days before expiry."
    )
    auto_renew_period_days: int = Field(
        default=30, description="How long one renewal extends a service."
    )
    ticket_auto_close_days: int = Field(
        default=7, description="Close tickets waiting on the customer this many days."
    )
    log_retention_days: int = Field(
        default=90, description="Archive automation and notification logs older than this."
    )
    archive_dir: str | None = Field(
        default=None,
        description=f"Directory for log archives; default $DAGSTER_HOME/{DEFAULT_ARCHIVE_SUBDIR}.",
    )
    archive_format: str = Field(
        default=ARCHIVE_FORMAT, description="Archive file format (gzip CSV)."
    )
    archive_batch_rows: int = Field(
        default=100_000, description="Rows per archive file (bounds memory per batch)."
    )

    @model_validator(mode="after")
    def _validate(self) -> DomainRules:
        # Building every policy runs every check; the error names the setting.
        for builder in (
            self.reminder_policy,
            self.auto_renew_policy,
            self.ticket_policy,
            self.archive_policy,
        ):
            builder()
        return self

    def _days(self, name: str, days: int, minimum: int = 1, maximum: int = 3650) -> timedelta:
        if isinstance(days, bool) or not isinstance(days, int) or not minimum <= days <= maximum:
            raise DomainRulesError(
                f"DomainRules.{name}={days!r} must be a whole number of days in "
                f"{minimum}..{maximum}; fix it where DomainRules is configured "
                f"(assets/domain_config.py: domain_resources, or the run's resource config)"
            )
        return timedelta(days=days)

    def _wrap(self, name: str, build: Callable[[], _T]) -> _T:
        try:
            return build()
        except DomainRulesError:
            raise
        except ValueError as exc:
            raise DomainRulesError(
                f"DomainRules.{name}: {exc}; fix it where DomainRules is configured "
                f"(assets/domain_config.py: domain_resources, or the run's resource config)"
            ) from None

    def reminder_policy(self) -> ReminderPolicy:
        """Overdue and renewal reminder stages and channels."""
        return self._wrap(
            "overdue_reminder_days/renewal_notice_days/channels",
            lambda: ReminderPolicy(
                overdue_days=tuple(self.overdue_reminder_days),
                renewal_days=tuple(self.renewal_notice_days),
                channels=tuple(self.channels),
            ),
        )

    def auto_renew_policy(self) -> AutoRenewPolicy:
        """Renewal window and period."""
        return AutoRenewPolicy(
            window=self._days("auto_renew_window_days", self.auto_renew_window_days),
            period=self._days("auto_renew_period_days", self.auto_renew_period_days),
        )

    def ticket_policy(self) -> TicketAutoClosePolicy:
        """How long a ticket may wait on the customer."""
        return TicketAutoClosePolicy(
            waiting=self._days("ticket_auto_close_days", self.ticket_auto_close_days)
        )

    def archive_policy(self) -> ArchivePolicy:
        """Retention, directory, format and batch size of the log archive."""
        retention = self._days("log_retention_days", self.log_retention_days)
        directory = (
            Path(self.archive_dir).expanduser()
            if self.archive_dir
            else load_settings().dagster_home / DEFAULT_ARCHIVE_SUBDIR
        )
        return self._wrap(
            "archive_format/archive_batch_rows",
            lambda: ArchivePolicy(
                directory=directory,
                retention=retention,
                batch_rows=self.archive_batch_rows,
                format=self.archive_format,
            ),
        )


def domain_resources() -> dict[str, dg.ConfigurableResource]:
    """The domain's resources: its business rules with the seed's defaults, validated here,
    at definition load."""
    return {"rules": DomainRules()}
