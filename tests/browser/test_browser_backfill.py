"""(c) Backfilling three days of billing_maintenance from its asset page, twice.

Catalog → billing_maintenance → Materialize → the partitions dialog: three past days typed
as a range → "Launch backfill"; once its runs end, the same backfill again. The second one
finds every notice already sent: the outbox holds no notice twice, the second backfill's
entries sent nothing, and every run of both backfills is a ledger entry
``backfill:<backfill id>:<day>`` that succeeded.
"""

from __future__ import annotations

from typing import Any

import pytest
from browser_support import DevServer, uses_stories
from stories import BACKFILL_DAYS, BACKFILL_TASK, outbox

pytestmark = pytest.mark.browser

TASK, DAYS = BACKFILL_TASK, BACKFILL_DAYS

#: Notices sent more than once for one business key (rule, object, time point, channel).
DUPLICATES_BY_EFFECT = """
SELECT s.rule, s.object_type, s.object_id, s.time_point, s.channel, COUNT(*) AS n
FROM notification_outbox o JOIN side_effects s ON s.id = o.effect_id
GROUP BY s.rule, s.object_type, s.object_id, s.time_point, s.channel HAVING COUNT(*) > 1
"""
#: The same, from the outbox alone: one recipient got the same notice twice.
DUPLICATES_BY_NOTICE = """
SELECT rule, channel, recipient, subject, COUNT(*) AS n FROM notification_outbox
GROUP BY rule, channel, recipient, subject HAVING COUNT(*) > 1
"""


def _duplicates(server: DevServer) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with server.source() as conn:
        return (
            [dict(r) for r in conn.execute(DUPLICATES_BY_EFFECT)],
            [dict(r) for r in conn.execute(DUPLICATES_BY_NOTICE)],
        )


def _check_backfill_in_ledger(
    server: DevServer, backfill: dict[str, Any], entries: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each run of the backfill is the one attempt of entry backfill:<id>:<day>, a success."""
    by_run = {r: e for e in entries for r in e["run_ids"]}
    found = []
    assert sorted(r["tags"]["dagster/partition"] for r in backfill["runs"]) == DAYS, backfill
    for run in backfill["runs"]:
        assert run["status"] == "SUCCESS", f"backfill run {run['runId']}: {run['status']}"
        entry = by_run.get(run["runId"])
        assert entry is not None, f"backfill run {run['runId']} is in no ledger entry"
        day = run["tags"]["dagster/partition"]
        assert entry["trigger"] == "backfill", entry
        assert entry["dedup_key"] == f"backfill:{backfill['id']}:{day}", entry
        assert entry["status"] == "success", entry
        assert run["tags"].get("dueledger/entry") == str(entry["id"]), run
        found.append(entry)
    return found


@uses_stories("backfill_twice")
def test_backfill_twice_from_the_asset_page_sends_each_notice_once(finish, dagster_dev: DevServer):
    story = finish("backfill_twice")
    first, second = story["first"], story["second"]
    assert second["id"] != first["id"]
    after_first, after_second = story["outbox_after_first"], outbox(dagster_dev)

    entries = dagster_dev.entries(TASK, "--trigger", "backfill")
    first_entries = _check_backfill_in_ledger(dagster_dev, first, entries)
    second_entries = _check_backfill_in_ledger(dagster_dev, second, entries)
    assert len({e["id"] for e in first_entries + second_entries}) == 2 * len(DAYS)

    by_effect, by_notice = _duplicates(dagster_dev)
    assert not by_effect, f"notices sent twice for one business key: {by_effect}"
    assert not by_notice, f"the same notice twice in the outbox: {by_notice}"
    # The days had notices to send (sample data), so "nothing twice" says something ...
    assert after_first, "the first backfill left the outbox empty: nothing was tested"
    # ... and the second backfill sent none of them again.
    second_keys = {f"{e['id']}:{e['dedup_key']}" for e in second_entries}
    resent = [row for row in after_second if row["entry_key"] in second_keys]
    assert not resent, f"the second backfill sent {len(resent)} notices again: {resent[:5]}"
