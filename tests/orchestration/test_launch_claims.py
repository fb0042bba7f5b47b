"""A catch-up's launch claim (orchestration/catch_up.py), on both ledgers: the first claim is
one insert the database lets one process win, a claim is taken over only when its holder can
no longer submit -- gone from this host, or past the claim's lifetime -- and never once its run
was submitted."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

from orchestration.catch_up import (
    LAUNCH_CLAIM_TTL,
    LaunchClaim,
    holder_gone,
    process_identity,
    record_submitted,
    take_launch_claim,
)
from resources.core.due import Due
from resources.core.entry import Trigger
from resources.ledger import RunLedger

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _gone_identity() -> str:
    host, namespace, _pid, _start = process_identity().rsplit(":", 3)
    return f"{host}:{namespace}:999999999:1"


def test_a_holder_is_gone_only_when_this_host_and_namespace_know_it() -> None:
    assert not holder_gone(process_identity())  # this process
    assert not holder_gone(process_identity(os.getppid()))  # alive
    assert holder_gone(_gone_identity())
    host, _ns, pid, start = _gone_identity().rsplit(":", 3)
    assert not holder_gone(f"{host}:1:{pid}:{start}")  # another container: cannot know
    assert not holder_gone(f"another-host:1:{pid}:{start}")
    assert not holder_gone("not an identity")


def test_a_claim_is_free_past_its_lifetime_or_when_its_holder_is_gone_never_once_submitted():
    alive = LaunchClaim(1, process_identity(), NOW, None, None)
    assert not alive.free(NOW + LAUNCH_CLAIM_TTL - timedelta(seconds=1))
    assert alive.free(NOW + LAUNCH_CLAIM_TTL)
    assert LaunchClaim(1, _gone_identity(), NOW, None, None).free(NOW)
    submitted = LaunchClaim(1, _gone_identity(), NOW, "run-1", NOW)
    assert not submitted.free(NOW + 10 * LAUNCH_CLAIM_TTL)


def test_claims_on_the_ledger(ledger: RunLedger) -> None:
    entry = ledger.ensure_entry(
        task_key="order_cleanup", trigger=Trigger.MANUAL, dedup_key=Due(NOW).key, now=NOW
    )
    me, other = process_identity(), process_identity(os.getppid())
    with ledger.transaction() as conn:
        assert take_launch_claim(conn, entry.id, me, NOW) == (True, None)
    with ledger.transaction() as conn:
        held, found = take_launch_claim(conn, entry.id, other, NOW)
    assert not held and found is not None and found.claimed_by == me
    # Past its lifetime the claim is taken over by a compare-and-set on its holder.
    later = NOW + LAUNCH_CLAIM_TTL
    with ledger.transaction() as conn:
        held, found = take_launch_claim(conn, entry.id, other, later)
    assert held and found is not None and found.claimed_by == me
    record_submitted(ledger, entry.id, other, "run-1")
    with ledger.transaction() as conn:  # submitted: never again, however late
        held, found = take_launch_claim(conn, entry.id, me, later + LAUNCH_CLAIM_TTL)
    assert not held and found is not None and found.run_id == "run-1"
