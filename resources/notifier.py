"""Notifications: one interface, an outbox (default) and an SMTP implementation, and the
exactly-once dispatch that every notifying task uses.

How a notification goes out (``dispatch_notifications``):

1. The rule hands over due messages, each with its idempotency key (rule, object, time
   point, channel). Keys already ``succeeded`` are skipped; keys left ``in_flight`` by a
   crashed delivery are reported *in doubt* and skipped; ``failed`` keys are retried.
2. **Outbox channels** (every channel for `OutboxNotifier`; all but email for
   `SmtpNotifier`): in ONE source-store transaction the effect row is claimed, the
   outbox row written and the effect marked ``succeeded``. Either both exist or
   neither: exactly once. A relay (outside this project) delivers pending outbox rows.
3. **External channels** (email for `SmtpNotifier`): the effect is claimed and
   committed first, then delivered, then settled ``succeeded`` (plus an outbox row with
   status ``delivered``, the notification log) or ``failed`` with the error. A crash
   between delivery and settlement leaves the row ``in_flight``: at most once, never a
   duplicate mail; an operator decides (set it to ``failed`` to resend).

A failed channel's row is ``failed`` while the other channels of the same reminder are
``succeeded``, so the next run retries that channel alone.

Every transaction that claims or writes a notification is fenced by the run's claim
(``resources/effects.py``): a run that lost its ledger entry writes no outbox row, and an
external delivery is checked once more right before it starts (a refused delivery's claims
are released as ``failed``, so a later run sends them). Settling a delivery that happened is
never refused: it records the truth.

A notification decided against (a plugin listener denied it) is recorded by
``skip_notifications``, once: a row under the skip's own key (never the message's key, so
nothing reads as sent) and an ``automation_log`` row saying why, in one transaction.
"""

from __future__ import annotations

import contextlib
import smtplib
from collections.abc import Sequence
from datetime import datetime
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any, Final

import dagster as dg
import sqlalchemy as sa
from pydantic import Field

from resources.core.fence import EffectGuard, FenceLost
from resources.effects import effect_transaction, verify_fence
from resources.idempotency import (
    EFFECT_FAILED,
    EFFECT_IN_FLIGHT,
    KEY_COLUMNS,
    OUTBOX_DELIVERED,
    OUTBOX_PENDING,
    STATE_NEW,
    claim_effects,
    classify_effects,
    normalize_keys,
    notification_outbox,
    read_effects,
    records,
    settle_effects,
)
from resources.source_schema import log_automation, naive_utc

if TYPE_CHECKING:
    # Imported where frames are made: the code location loads without pandas.
    import pandas as pd

#: What a message frame must carry: the idempotency key plus what to send to whom.
MESSAGE_COLUMNS: Final = (*KEY_COLUMNS, "customer_id", "recipient", "subject", "body")

OUTCOME_SENT: Final = "sent"
OUTCOME_ALREADY_SENT: Final = "skipped_already_sent"
OUTCOME_FAILED: Final = "failed"
OUTCOME_IN_DOUBT: Final = "in_doubt"
OUTCOMES: Final = (OUTCOME_SENT, OUTCOME_ALREADY_SENT, OUTCOME_FAILED, OUTCOME_IN_DOUBT)

#: Messages per transaction: bounds lock time and statement size.
DISPATCH_CHUNK_ROWS: Final = 1000

#: The ``automation_log`` action of a skipped notification.
ACTION_SKIPPED: Final = "notification_skipped"


class Notifier(dg.ConfigurableResource):
    """Where notifications go. Subclasses choose which channels they deliver themselves.

    - Channels NOT in `external_channels()` are written to the `notification_outbox`
      table in the same transaction as their idempotency row (exactly once).
    - Channels in `external_channels()` are handed to `deliver` after their idempotency
      row is committed (at most once; see the module docstring).
    """

    def external_channels(self) -> frozenset[str]:
        """Channels this notifier delivers itself, outside the database transaction."""
        return frozenset()

    def deliver(self, messages: pd.DataFrame) -> list[str | None]:
        """Deliver `messages` (MESSAGE_COLUMNS + `effect_id`); one error text or None per row,
        in order. Must not raise for a single bad message: report it and go on."""
        raise NotImplementedError(
            f"{type(self).__name__} declares external channels but does not implement deliver()"
        )


class OutboxNotifier(Notifier):
    """The default: every channel goes to the `notification_outbox` table in the source
    store, atomically with its idempotency row. Delivery is a relay's job."""


class SmtpSessionError(RuntimeError):
    """An SMTP session could not be opened (connect, STARTTLS or login failed)."""


class SmtpNotifier(Notifier):
    """Email over SMTP; other channels (sms, in_app) go to the outbox for their gateways.

    Register with secrets from the environment, e.g.
    ``SmtpNotifier(host="smtp.example.org", sender="billing@example.org",
    username=dg.EnvVar("SMTP_USER"), password=dg.EnvVar("SMTP_PASSWORD"), starttls=True)``.
    One SMTP session per delivery batch; a refused recipient fails only its message.
    """

    host: str = Field(description="SMTP server host name.")
    port: int = Field(default=25, description="SMTP port (587 with STARTTLS is typical).")
    sender: str = Field(description="From address of every message.")
    username: str | None = Field(default=None, description="Login user, if the server needs one.")
    password: str | None = Field(default=None, description="Login password (use dg.EnvVar).")
    starttls: bool = Field(default=False, description="Upgrade the session with STARTTLS.")
    timeout_seconds: float = Field(default=30.0, description="Socket timeout per operation.")

    def external_channels(self) -> frozenset[str]:
        return frozenset({"email"})

    def _message(self, row: Any) -> EmailMessage:
        message = EmailMessage()
        message["From"] = self.sender
        message["To"] = row.recipient
        message["Subject"] = row.subject
        # A stable Message-ID per effect lets a receiving system drop a duplicate, should
        # an operator ever resend an in-doubt message.
        message["Message-ID"] = f"<effect-{int(row.effect_id)}@dueledger>"
        message["X-Dueledger-Effect"] = f"{row.rule}/{row.object_type}/{int(row.object_id)}"
        message.set_content(row.body)
        return message

    def open_session(self) -> smtplib.SMTP:
        """A connected SMTP session (STARTTLS and login done, as configured); the caller
        closes it (``with``). Raises :class:`SmtpSessionError` saying what failed (never
        the password)."""
        try:
            session = smtplib.SMTP(self.host, self.port, timeout=self.timeout_seconds)
        except (OSError, smtplib.SMTPException) as exc:
            raise SmtpSessionError(
                f"SMTP connect to {self.host}:{self.port} failed: {exc}"
            ) from exc
        try:
            if self.starttls:
                session.starttls()
            if self.username:
                session.login(self.username, self.password or "")
        except (OSError, smtplib.SMTPException) as exc:
            with contextlib.suppress(OSError, smtplib.SMTPException):
                session.close()
            raise SmtpSessionError(f"SMTP session setup failed: {exc}") from exc
        return session

    def deliver(self, messages: pd.DataFrame) -> list[str | None]:
        if messages.empty:
            return []
        try:
            session = self.open_session()
        except SmtpSessionError as exc:
            return [str(exc)] * len(messages)
        errors: list[str | None] = []
        with session:
            # One message at a time is inherent to SMTP; this is I/O, not the rule's hot path.
            for row in messages.itertuples(index=False):
                try:
                    session.send_message(self._message(row))
                    errors.append(None)
                except (OSError, smtplib.SMTPException) as exc:
                    errors.append(f"{type(exc).__name__}: {exc}")
                    if isinstance(exc, smtplib.SMTPServerDisconnected):
                        # The session is gone: the rest fail too (and are retried next run).
                        errors.extend(["SMTP server disconnected"] * (len(messages) - len(errors)))
                        break
        return errors


# --- dispatch -------------------------------------------------------------------------------


def _outbox_rows(
    messages: pd.DataFrame, *, at: datetime, task_key: str, entry_key: str, status: str
) -> list[dict[str, Any]]:
    import pandas as pd

    frame = pd.DataFrame(
        {
            "effect_id": messages["effect_id"].astype("int64"),
            "created_at": naive_utc(at),
            "task_key": task_key,
            "entry_key": entry_key,
            "rule": messages["rule"],
            "channel": messages["channel"],
            "customer_id": messages["customer_id"].astype("int64"),
            "recipient": messages["recipient"],
            "subject": messages["subject"].str.slice(0, 300),
            "body": messages["body"],
            "status": status,
        }
    )
    return records(frame)


def _attach_claims(messages: pd.DataFrame, claimed: pd.DataFrame) -> pd.DataFrame:
    """The messages that were claimed, with their `effect_id` and `attempts`."""
    keyed = normalize_keys(messages.drop(columns=["effect_id", "attempts"], errors="ignore"))
    return keyed.merge(
        claimed[["effect_id", *KEY_COLUMNS, "attempts"]], on=list(KEY_COLUMNS), how="inner"
    )


def dispatch_notifications(
    engine: sa.Engine,
    notifier: Notifier,
    messages: pd.DataFrame,
    *,
    at: datetime,
    task_key: str,
    entry_key: str,
    guard: EffectGuard | None,
    chunk_rows: int = DISPATCH_CHUNK_ROWS,
) -> pd.DataFrame:
    """Send each message at most once per idempotency key; return the outcome of each.

    Returns `messages` (same rows, same order) plus `outcome` (one of OUTCOMES),
    `effect_id` and `error`. Messages whose key was claimed by a concurrent run in the
    meantime count as `skipped_already_sent`. See the module docstring for the protocol.
    """
    import pandas as pd

    missing = [c for c in MESSAGE_COLUMNS if c not in messages.columns]
    if missing:
        raise ValueError(f"messages frame is missing column(s) {missing}")
    out = messages.reset_index(drop=True).copy()
    duplicated = normalize_keys(out[list(KEY_COLUMNS)]).duplicated()
    if duplicated.any():
        raise ValueError(
            f"{int(duplicated.sum())} message(s) repeat an idempotency key "
            f"({', '.join(KEY_COLUMNS)}); a rule must yield each key once"
        )
    out["outcome"] = OUTCOME_ALREADY_SENT
    out["error"] = None
    if out.empty:
        out["effect_id"] = pd.array([], dtype="Int64")
        return out
    classified = classify_effects(out[list(KEY_COLUMNS)], read_effects(engine, out))
    out["effect_id"] = classified["effect_id"].astype("Int64")  # same index as `out`
    state = classified["state"]
    out.loc[(state == EFFECT_IN_FLIGHT).to_numpy(), "outcome"] = OUTCOME_IN_DOUBT
    todo_mask = state.isin([STATE_NEW, EFFECT_FAILED]).to_numpy()
    todo = out.loc[todo_mask].assign(state=state[todo_mask].to_numpy())
    external = notifier.external_channels()
    key_index = pd.MultiIndex.from_frame(normalize_keys(out[list(KEY_COLUMNS)]))

    def record(settled: pd.DataFrame, outcome: str, errors: Sequence[str | None] = ()) -> None:
        positions = key_index.get_indexer(pd.MultiIndex.from_frame(settled[list(KEY_COLUMNS)]))
        out.loc[positions, "outcome"] = outcome
        out.loc[positions, "effect_id"] = settled["effect_id"].to_numpy()
        if errors:
            out.loc[positions, "error"] = list(errors)

    for start in range(0, len(todo), chunk_rows):
        chunk = todo.iloc[start : start + chunk_rows]
        outbox_part = chunk.loc[~chunk["channel"].isin(external)]
        external_part = chunk.loc[chunk["channel"].isin(external)]
        if not outbox_part.empty:
            with effect_transaction(engine, guard, "queue notifications") as conn:
                claimed = claim_effects(
                    conn, outbox_part, at=at, task_key=task_key, entry_key=entry_key
                )
                ready = _attach_claims(outbox_part, claimed)
                if not ready.empty:
                    conn.execute(
                        sa.insert(notification_outbox),
                        _outbox_rows(
                            ready,
                            at=at,
                            task_key=task_key,
                            entry_key=entry_key,
                            status=OUTBOX_PENDING,
                        ),
                    )
                    settle_effects(conn, succeeded=ready["effect_id"], at=at)
            if not ready.empty:
                record(ready, OUTCOME_SENT)
        if not external_part.empty:
            # Commit the claim first: delivery cannot be rolled back.
            with effect_transaction(engine, guard, "claim notifications to deliver") as conn:
                claimed = claim_effects(
                    conn, external_part, at=at, task_key=task_key, entry_key=entry_key
                )
            ready = _attach_claims(external_part, claimed)
            if ready.empty:
                continue
            try:
                # No transaction can hold a delivery: check the fence right before it.
                verify_fence(guard, "deliver notifications")
            except FenceLost as lost:
                # Nothing was delivered: release the claims, so a later run sends them.
                with engine.begin() as conn:
                    settle_effects(
                        conn,
                        succeeded=(),
                        failed={int(i): str(lost) for i in ready["effect_id"]},
                        at=at,
                    )
                raise
            errors = notifier.deliver(ready)
            if len(errors) != len(ready):
                raise RuntimeError(
                    f"{type(notifier).__name__}.deliver returned {len(errors)} results for "
                    f"{len(ready)} messages; it must return one per message"
                )
            failed_mask = pd.Series([e is not None for e in errors], index=ready.index)
            delivered = ready.loc[~failed_mask]
            failed = ready.loc[failed_mask]
            failed_errors = [e for e in errors if e is not None]
            with engine.begin() as conn:
                if not delivered.empty:
                    conn.execute(
                        sa.insert(notification_outbox),
                        _outbox_rows(
                            delivered,
                            at=at,
                            task_key=task_key,
                            entry_key=entry_key,
                            status=OUTBOX_DELIVERED,
                        ),
                    )
                settle_effects(
                    conn,
                    succeeded=delivered["effect_id"],
                    failed=dict(zip(failed["effect_id"].astype(int), failed_errors, strict=True)),
                    at=at,
                )
            if not delivered.empty:
                record(delivered, OUTCOME_SENT)
            if not failed.empty:
                record(failed, OUTCOME_FAILED, failed_errors)
    return out


def skip_notifications(
    engine: sa.Engine,
    skips: pd.DataFrame,
    *,
    at: datetime,
    task_key: str,
    entry_key: str,
    guard: EffectGuard | None,
) -> pd.DataFrame:
    """Record notifications that will not be sent, each once; return the rows recorded now.

    ``skips`` has KEY_COLUMNS -- the skip's own key (e.g. rule
    ``service_renewal_notice_skipped``), not the message's -- and ``detail`` (why). In one
    transaction: the key's ``side_effects`` row, ``succeeded`` (the skip is recorded), and an
    ``automation_log`` row (action ``notification_skipped``, object, detail). A key recorded
    before, by this run or a concurrent one, is left alone and not returned.
    """
    if skips.empty:
        return skips.iloc[0:0]
    missing = [c for c in (*KEY_COLUMNS, "detail") if c not in skips.columns]
    if missing:
        raise ValueError(f"skips frame is missing column(s) {missing}")
    keys = normalize_keys(skips.reset_index(drop=True))
    candidates = classify_effects(keys[list(KEY_COLUMNS)], read_effects(engine, keys))
    candidates = candidates.loc[candidates["state"] == STATE_NEW]
    if candidates.empty:
        return keys.iloc[0:0]
    # Fenced like a notification: a run that lost its entry must not settle the question.
    with effect_transaction(engine, guard, "record skipped notifications") as conn:
        claimed = claim_effects(conn, candidates, at=at, task_key=task_key, entry_key=entry_key)
        recorded = keys.merge(claimed[["effect_id", *KEY_COLUMNS]], on=list(KEY_COLUMNS))
        if not recorded.empty:
            log_automation(
                conn,
                at=at,
                task_key=task_key,
                entry_key=entry_key,
                action=ACTION_SKIPPED,
                items=zip(
                    recorded["object_type"].tolist(),
                    recorded["object_id"].tolist(),
                    recorded["detail"].tolist(),
                    strict=True,
                ),
            )
            settle_effects(conn, succeeded=recorded["effect_id"], at=at)
    return recorded


def outcome_counts(outcomes: pd.DataFrame, by: Sequence[str] = ("rule", "channel")) -> pd.DataFrame:
    """Counts of due messages and of each outcome per `by` group (one row per group)."""
    import pandas as pd

    columns = [*by, "due", *OUTCOMES]
    if outcomes.empty:
        return pd.DataFrame(columns=columns)
    table = (
        outcomes.groupby([*by, "outcome"], sort=True)
        .size()
        .unstack("outcome", fill_value=0)
        .reindex(columns=list(OUTCOMES), fill_value=0)
    )
    table.insert(0, "due", table.sum(axis=1))
    return table.reset_index()[columns]
