"""The history checker can fail: a clean history passes, and each doctored copy of it -- one
broken rule at a time -- is reported under that rule's name, and only that one.

The clean history is small and written by hand so each record's role is visible: task
``mail`` with four dues (one success with two effects, one reclaimed after its first effect
and refused a late one, one failed and manually retried, one missed) and a duplicate run the
ledger refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from history.history_checker import CHECKS, check
from history.history_format import HistoryWriter, Record, read_history

D1, D2, D3, D4 = (f"2026-01-05T00:0{n}:00Z" for n in (1, 2, 3, 4))


def _entry(id_: int, dedup: str, status: str, runs: list[str], **extra: Any) -> Record:
    return {
        "type": "entry",
        "id": id_,
        "task_key": "mail",
        "trigger": extra.pop("trigger", "schedule"),
        "dedup_key": dedup,
        "due": dedup.removeprefix("due:") if dedup.startswith("due:") else extra.pop("due", D3),
        "status": status,
        "failure_kind": extra.pop("failure_kind", None),
        "error": extra.pop("error", None),
        "parent_id": extra.pop("parent_id", None),
        "run_ids": runs,
        "finished_at": extra.pop("finished_at", None),
        "updated_at": extra.pop("updated_at", "2026-01-05T00:05:00Z"),
        "manual_retry_at": extra.pop("manual_retry_at", None),
        "summary": extra.pop(
            "summary", {"late_job_rejections": [], "dispatch_failures": [], "hooks": []}
        ),
        **extra,
    }


def clean() -> list[Record]:
    def at(seconds: int) -> str:
        return f"2026-01-05T00:{seconds // 60:02d}:{seconds % 60:02d}Z"

    return [
        {"type": "meta", "source": "hand-written", "window_seconds": 300},
        {"type": "task", "task": "mail", "lease_ttl_seconds": 60, "max_attempts": 1},
        *({"type": "due", "task": "mail", "due": d} for d in (D1, D2, D3, D4)),
        # D1: run a claims, two effects, succeeds; run b (a second daemon's) is refused.
        {"type": "run", "run_id": "a", "task": "mail", "due": D1, "status": "SUCCESS"},
        {"type": "run", "run_id": "b", "task": "mail", "due": D1, "status": "SUCCESS",
         "outcome": "refused"},
        {"type": "claim", "entry_id": 1, "run_id": "a", "token": 1, "worker": "h:1", "seq": 1,
         "at": at(62)},
        {"type": "claim_refused", "entry_id": 1, "run_id": "b", "seq": 2, "at": at(63)},
        {"type": "effect", "task": "mail", "due": D1, "effect": "e0", "entry_id": 1,
         "run_id": "a", "token": 1, "seq": 3, "at": at(64)},
        {"type": "effect", "task": "mail", "due": D1, "effect": "e1", "entry_id": 1,
         "run_id": "a", "token": 1, "seq": 4, "at": at(66)},
        {"type": "release", "entry_id": 1, "run_id": "a", "token": 1, "how": "success", "seq": 5,
         "at": at(67)},
        _entry(1, f"due:{D1}", "success", ["a"], finished_at=at(67),
               summary={"late_job_rejections": [{"run_id": "b"}], "dispatch_failures": [],
                        "hooks": []}),
        # D2: run c claims, one effect, freezes; reclaimed; its late effect is refused.
        {"type": "run", "run_id": "c", "task": "mail", "due": D2, "status": "FAILURE"},
        {"type": "claim", "entry_id": 2, "run_id": "c", "token": 1, "worker": "h:2", "seq": 6,
         "at": at(121)},
        {"type": "effect", "task": "mail", "due": D2, "effect": "e0", "entry_id": 2,
         "run_id": "c", "token": 1, "seq": 7, "at": at(122)},
        {"type": "release", "entry_id": 2, "run_id": "c", "token": 1, "how": "reclaim", "seq": 8,
         "at": at(190)},
        {"type": "commit", "entry_id": 2, "run_id": "c", "token": 1, "effect": "e1",
         "committed": False, "seq": 9, "at": at(200)},
        _entry(2, f"due:{D2}", "failed", ["c"], failure_kind="lease_reclaimed",
               finished_at=at(190)),
        # D3: run d fails (error); an operator retries it: child entry 4, run e.
        {"type": "run", "run_id": "d", "task": "mail", "due": D3, "status": "FAILURE"},
        {"type": "claim", "entry_id": 3, "run_id": "d", "token": 1, "worker": "h:3", "seq": 10,
         "at": at(181)},
        {"type": "release", "entry_id": 3, "run_id": "d", "token": 1, "how": "fail", "seq": 11,
         "at": at(185)},
        _entry(3, f"due:{D3}", "failed", ["d"], failure_kind="error", finished_at=at(185),
               manual_retry_at=at(250)),
        {"type": "run", "run_id": "e", "task": "mail", "due": D3, "status": "SUCCESS",
         "trigger": "manual_retry", "parent_entry": "3"},
        {"type": "claim", "entry_id": 4, "run_id": "e", "token": 1, "worker": "h:4", "seq": 12,
         "at": at(251)},
        {"type": "effect", "task": "mail", "due": D3, "effect": "e0", "entry_id": 4,
         "run_id": "e", "token": 1, "seq": 13, "at": at(252)},
        {"type": "release", "entry_id": 4, "run_id": "e", "token": 1, "how": "success",
         "seq": 14, "at": at(253)},
        _entry(4, "retry:3", "success", ["e"], trigger="manual_retry", parent_id=3,
               finished_at=at(253)),
        {"type": "audit", "id": 1, "action": "manual_retry", "entry_id": 3, "child_entry_id": 4,
         "operator": "ops", "outcome": "allowed: created child entry 4"},
        # D4: never fired; the summary reports it missed.
        {"type": "missed", "task": "mail", "due": D4, "reason": "summary missed_dues"},
        {"type": "summary", "tasks": [{"task_key": "mail", "failed_24h": 2,
                                       "dispatch_failed_24h": 0}]},
    ]  # fmt: skip


def _where(records: list[Record], **match: Any) -> Record:
    found = [r for r in records if all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def _add(record: Record) -> Callable[[list[Record]], None]:
    return lambda records: records.append(record)


def _set(match: dict[str, Any], **changes: Any) -> Callable[[list[Record]], None]:
    return lambda records: _where(records, **match).update(changes)


def _drop(**match: Any) -> Callable[[list[Record]], None]:
    return lambda records: records.remove(_where(records, **match))


DOCTORED: dict[str, tuple[str, Callable[[list[Record]], None]]] = {
    "the same effect delivered twice": (
        "double_effect",
        _add(
            {
                "type": "effect",
                "task": "mail",
                "due": D1,
                "effect": "e1",
                "entry_id": 1,
                "run_id": "a",
                "token": 1,
                "seq": 4.5,
                "at": "2026-01-05T00:01:06Z",
            }
        ),
    ),
    "an effect by a run that never claimed": (
        "effect_without_claim",
        _set({"type": "effect", "due": D1, "effect": "e1"}, run_id="stranger"),
    ),
    "an effect after the reclaim": (
        "effect_after_release",
        _add(
            {
                "type": "effect",
                "task": "mail",
                "due": D2,
                "effect": "e1",
                "entry_id": 2,
                "run_id": "c",
                "token": 1,
                "seq": 9,
                "at": "2026-01-05T00:03:20Z",
            }
        ),
    ),
    "a refused run that acted": (
        "refused_run_effect",
        _set({"type": "run", "run_id": "a"}, outcome="refused"),
    ),
    "two processes of one run holding one claim": (
        "shared_claim",
        _add(
            {
                "type": "claim",
                "entry_id": 1,
                "run_id": "a",
                "token": 1,
                "worker": "h:99",
                "seq": 1.5,
                "at": "2026-01-05T00:01:02Z",
            }
        ),
    ),
    "a second claim while the first is held": (
        "claim_order",
        _add(
            {
                "type": "claim",
                "entry_id": 1,
                "run_id": "x",
                "token": 2,
                "worker": "h:5",
                "seq": 4.5,
                "at": "2026-01-05T00:01:05Z",
            }
        ),
    ),
    "two entries for one due": (
        "two_entries",
        _add(_entry(9, f"due:{D1}", "success", ["z"], finished_at="2026-01-05T00:01:30Z")),
    ),
    "a due left running": (
        "unclassified_due",
        _set({"type": "entry", "id": 1}, status="running"),
    ),
    "a failure without a kind": (
        "unclassified_due",
        _set({"type": "entry", "id": 3}, failure_kind=None),
    ),
    "a due that silently vanished": ("unclassified_due", _drop(type="missed", due=D4)),
    "a missed due without a reason": (
        "unclassified_due",
        _set({"type": "missed", "due": D4}, reason=""),
    ),
    "a due classified after its window and lease": (
        "late_classification",
        _set({"type": "entry", "id": 1}, finished_at="2026-01-05T00:09:00Z"),
    ),
    "a failed run in no entry": (
        "failed_run_invisible",
        _add({"type": "run", "run_id": "ghost", "task": "mail", "due": D1, "status": "FAILURE"}),
    ),
    "summary not counting a failure": (
        "failed_run_invisible",
        _set({"type": "summary"}, tasks=[{"task_key": "mail", "failed_24h": 1}]),
    ),
    "summary counting a refused run as failed": (
        "failed_run_invisible",
        _set({"type": "summary"}, tasks=[{"task_key": "mail", "failed_24h": 3}]),
    ),
    "a manual retry without its parent": (
        "orphan_manual_retry",
        _set({"type": "entry", "id": 4}, parent_id=77),
    ),
    "a manual retry of an entry never stamped": (
        "orphan_manual_retry",
        _set({"type": "entry", "id": 3}, manual_retry_at=None),
    ),
    "a manual retry without its audit record": (
        "orphan_manual_retry",
        _set({"type": "audit", "id": 1}, child_entry_id=5),
    ),
    "a manual retry run naming no entry": (
        "orphan_manual_retry",
        _set({"type": "run", "run_id": "e"}, parent_entry="42"),
    ),
}


def test_the_clean_history_keeps_every_rule() -> None:
    assert check(clean()) == []


def test_every_rule_is_doctored_at_least_once() -> None:
    assert {rule for rule, _ in DOCTORED.values()} == set(CHECKS)


@pytest.mark.parametrize(("rule", "doctor"), DOCTORED.values(), ids=list(DOCTORED))
def test_a_doctored_history_is_reported_under_its_rule(
    rule: str, doctor: Callable[[list[Record]], None]
) -> None:
    records = copy.deepcopy(clean())
    doctor(records)
    violations = check(records)
    assert violations, "the checker missed it"
    assert {v.check for v in violations} == {rule}, [str(v) for v in violations]


def test_a_history_survives_the_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path) as writer:
        writer.write_all(clean())
    assert read_history(path) == [dict(r) for r in clean()]
    with pytest.raises(ValueError, match="not a history record"):
        path.write_text('{"type": "nonsense"}\n')
        read_history(path)
