"""Plugin hooks without Dagster runs: isolation, results, registration, `dueledger hooks`.

The end-to-end tests (schedule evaluation, real runs, the ledger) are in
test_hooks_runs.py.
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hook_support import registry_of

from orchestration.cli import main
from orchestration.services.hooks.creation import announce_creation, creation_context, gate_creation
from orchestration.services.hooks.firing import Dispatch, ListenerOutcome, fire
from orchestration.services.hooks.loading import load_hooks
from orchestration.services.hooks.records import decode_outcomes
from orchestration.services.hooks.vocabulary import (
    AFTER_TASK_CREATE,
    BEFORE_TASK_CREATE,
    ENTRY_POINT_GROUP,
    ENV_HOOKS_FILE,
    EVENTS,
    LOGGER,
    OUTCOME_ALLOW,
    OUTCOME_DEGRADE,
    OUTCOME_DENY,
    OUTCOME_DENY_IGNORED,
    OUTCOME_ERROR,
    OUTCOME_INVALID,
    OUTCOME_TIMEOUT,
    SOURCE_CONFIG,
    SOURCE_ENTRY_POINT,
    TAG_HOOKS,
    TASK_AFTER,
    TASK_BEFORE,
    TICK_EVERY_SLOT,
    HookContext,
    HookResult,
    allow,
    degrade,
    deny,
    listener,
)
from resources.core import tags as t
from resources.core.entry import Trigger

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "example_plugin"
PLUGIN_MODULE = "example_dueledger_plugin"
DUE = "2026-11-30T22:45:00Z"

# Listeners used by the config-file tests (referenced as "<this module>:<name>").
SEEN: list[HookContext] = []


def plain_listener(ctx: HookContext) -> None:
    SEEN.append(ctx)


@listener(TASK_AFTER, name="decorated")
def decorated_listener(ctx: HookContext) -> HookResult:
    return allow()


def create_ctx(**tags: str) -> HookContext:
    base = {t.TAG_TASK: "order_cleanup", t.TAG_TRIGGER: Trigger.SCHEDULE.value, t.TAG_DUE: DUE}
    return creation_context({**base, **tags})


def outcome_of(dispatch: Dispatch, name: str) -> ListenerOutcome:
    (found,) = [o for o in dispatch.outcomes if o.listener == name]
    return found


# --- isolation -----------------------------------------------------------------------------


def test_a_raising_listener_becomes_an_error_outcome_and_the_next_listener_still_runs():
    calls: list[str] = []

    @listener(BEFORE_TASK_CREATE, blocking=True)
    def boom(ctx):
        raise RuntimeError("plugin bug")

    @listener(BEFORE_TASK_CREATE)
    def after_boom(ctx):
        calls.append(ctx.task_key)

    dispatch = fire(create_ctx(), registry=registry_of(boom, after_boom))
    assert outcome_of(dispatch, "boom").outcome == OUTCOME_ERROR
    assert "RuntimeError: plugin bug" in (outcome_of(dispatch, "boom").error or "")
    assert outcome_of(dispatch, "after_boom").outcome == OUTCOME_ALLOW
    assert calls == ["order_cleanup"]
    # A blocking listener that fails does not deny: hooks fail open.
    assert not dispatch.denied


def test_a_slow_listener_is_abandoned_at_its_timeout_and_the_next_listener_still_runs():
    release = threading.Event()

    @listener(BEFORE_TASK_CREATE, blocking=True, timeout_seconds=0.2)
    def slow(ctx):
        release.wait(30)
        return deny("too late to count")

    @listener(BEFORE_TASK_CREATE)
    def quick(ctx):
        return allow()

    try:
        dispatch = fire(create_ctx(), registry=registry_of(slow, quick))
    finally:
        release.set()
    slow_outcome = outcome_of(dispatch, "slow")
    assert slow_outcome.outcome == OUTCOME_TIMEOUT
    assert "0.2s" in (slow_outcome.error or "")
    assert outcome_of(dispatch, "quick").outcome == OUTCOME_ALLOW
    assert not dispatch.denied  # its late deny is dropped


def test_a_returned_value_that_hangs_when_read_is_bounded_by_the_timeout():
    release = threading.Event()

    class Sleepy:
        def __repr__(self) -> str:
            release.wait(30)
            return "sleepy"

    @listener(BEFORE_TASK_CREATE, timeout_seconds=0.2)
    def odd(ctx):
        return Sleepy()

    @listener(BEFORE_TASK_CREATE, blocking=True, timeout_seconds=0.2)
    def slow_reason(ctx):
        return deny(Sleepy())

    started = time.monotonic()
    try:
        dispatch = fire(create_ctx(), registry=registry_of(odd, slow_reason))
    finally:
        release.set()
    assert time.monotonic() - started < 10
    assert outcome_of(dispatch, "odd").outcome == OUTCOME_TIMEOUT
    assert outcome_of(dispatch, "slow_reason").outcome == OUTCOME_TIMEOUT
    assert not dispatch.denied


def test_a_listener_returning_something_else_is_recorded_as_invalid():
    @listener(TASK_BEFORE)
    def odd(ctx):
        return "yes please"

    ctx = create_ctx().for_event(TASK_BEFORE, entry_id=1, attempt=1, run_id="r")
    dispatch = fire(ctx, registry=registry_of(odd))
    assert outcome_of(dispatch, "odd").outcome == OUTCOME_INVALID
    assert "yes please" in (outcome_of(dispatch, "odd").error or "")


def test_a_listener_cannot_change_the_context_it_is_given():
    @listener(BEFORE_TASK_CREATE)
    def meddler(ctx):
        ctx.tags[t.TAG_TASK] = "other"

    ctx = create_ctx()
    dispatch = fire(ctx, registry=registry_of(meddler))
    assert outcome_of(dispatch, "meddler").outcome == OUTCOME_ERROR
    assert ctx.tags[t.TAG_TASK] == "order_cleanup"


# --- deny and degrade ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocking", "outcome", "denied"),
    [(True, OUTCOME_DENY, True), (False, OUTCOME_DENY_IGNORED, False)],
    ids=["blocking", "not_blocking"],
)
def test_a_deny_is_honored_only_from_a_blocking_listener(blocking, outcome, denied):
    @listener(BEFORE_TASK_CREATE, blocking=blocking)
    def gate(ctx):
        return deny("maintenance window")

    dispatch = fire(create_ctx(), registry=registry_of(gate))
    assert outcome_of(dispatch, "gate").outcome == outcome
    assert dispatch.denied is denied
    assert "maintenance window" in (outcome_of(dispatch, "gate").reason or "")
    assert (dispatch.deny_reason is not None) is denied


def test_a_deny_outside_before_task_create_is_recorded_and_ignored():
    @listener(TASK_BEFORE, blocking=True)
    def late_gate(ctx):
        return deny("too late")

    ctx = create_ctx().for_event(TASK_BEFORE, entry_id=1, attempt=1, run_id="r")
    dispatch = fire(ctx, registry=registry_of(late_gate))
    assert outcome_of(dispatch, "late_gate").outcome == OUTCOME_DENY_IGNORED
    assert not dispatch.denied


def test_a_degrade_adds_tags_but_never_changes_or_reserves_contract_ones():
    @listener(BEFORE_TASK_CREATE)
    def softer(ctx):
        return degrade(
            {
                "plugin/mode": "degraded",
                "dagster/priority": "-1",
                t.TAG_DUE: "2000-01-01T00:00:00Z",  # exists on the request: ignored
                "dueledger/new": "x",  # reserved namespace: ignored
                "dagster/max_retries": "99",  # reserved namespace: ignored
            },
            reason="source is slow",
        )

    gate = gate_creation(create_ctx().tags, registry=registry_of(softer))
    assert not gate.denied
    assert gate.tags[t.TAG_DUE] == DUE
    assert gate.tags["plugin/mode"] == "degraded"
    assert gate.tags["dagster/priority"] == "-1"
    assert "dueledger/new" not in gate.tags and "dagster/max_retries" not in gate.tags
    outcome = outcome_of(gate.before, "softer")
    assert outcome.outcome == OUTCOME_DEGRADE
    assert len(outcome.ignored_tags) == 3


def test_creation_outcomes_travel_in_a_bounded_tag_and_decode_back():
    @listener(BEFORE_TASK_CREATE, AFTER_TASK_CREATE)
    def chatty(ctx):
        return deny("x" * 5000)  # not blocking: recorded, ignored, cut short

    registry = registry_of(chatty)
    gate = announce_creation(gate_creation(create_ctx().tags, registry=registry), registry=registry)
    tags = gate.run_tags()
    items = decode_outcomes(tags[TAG_HOOKS])
    assert [i["event"] for i in items] == [BEFORE_TASK_CREATE, AFTER_TASK_CREATE]
    assert all(len(i["reason"]) <= 200 for i in items)
    assert decode_outcomes("not json") == []


# --- structured log lines ---------------------------------------------------------------------


def test_every_outcome_is_logged_as_one_json_object_per_line(caplog):
    @listener(BEFORE_TASK_CREATE)
    def ok(ctx):
        return None

    @listener(BEFORE_TASK_CREATE)
    def bad(ctx):
        raise ValueError("nope")

    caplog.set_level(logging.INFO, logger=LOGGER.name)
    fire(create_ctx(), registry=registry_of(ok, bad))
    lines = [r for r in caplog.records if r.name == LOGGER.name]
    assert len(lines) == 2
    parsed = [json.loads(r.getMessage()) for r in lines]
    assert [(p["listener"], p["outcome"]) for p in parsed] == [("ok", "allow"), ("bad", "error")]
    assert all("\n" not in r.getMessage() for r in lines)
    assert parsed[0]["hook"] == BEFORE_TASK_CREATE and parsed[0]["due"] == DUE
    assert [r.levelno for r in lines] == [logging.INFO, logging.WARNING]


# --- declaration errors ------------------------------------------------------------------------


def test_an_unknown_event_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown event 'task_befor'.*task_before"):
        listener("task_befor")(plain_listener)
    with pytest.raises(ValueError, match="timeout_seconds"):
        listener(TASK_BEFORE, timeout_seconds=0)(plain_listener)


# --- the config file ---------------------------------------------------------------------------


def write_config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "hooks.toml"
    path.write_text(text, encoding="utf-8")
    return {ENV_HOOKS_FILE: str(path)}


def test_the_config_file_adds_listeners_by_target_and_reports_what_it_cannot_load(tmp_path):
    here = __name__
    environ = write_config(
        tmp_path,
        f"""
[[listeners]]
target = "{here}:plain_listener"
events = ["task_before", "tick.every_slot"]
blocking = true
timeout_seconds = 1.5
name = "plain"

[[listeners]]
target = "{here}:decorated_listener"

[[listeners]]
target = "no_such_module_for_hooks:thing"

[[listeners]]
target = "{here}:plain_listener"
name = "no_events"

[[listeners]]
target = "{here}:decorated_listener"
events = ["task_befor"]
name = "typo"
""",
    )
    registry = load_hooks(environ=environ, entry_points=())
    by_name = {x.name: x for x in registry.listeners}
    assert set(by_name) == {"plain", "decorated"}
    assert by_name["plain"].events == (TASK_BEFORE, TICK_EVERY_SLOT)
    assert by_name["plain"].blocking is True
    assert by_name["plain"].timeout_seconds == 1.5
    assert by_name["plain"].source == SOURCE_CONFIG
    assert by_name["decorated"].events == (TASK_AFTER,)
    errors = {e.name: e.error for e in registry.load_errors}
    (missing,) = [e for e in registry.load_errors if e.target == "no_such_module_for_hooks:thing"]
    assert "ModuleNotFoundError" in missing.error
    assert "needs events" in errors["no_events"]
    assert "unknown event 'task_befor'" in errors["typo"]


def test_a_listener_module_that_calls_sys_exit_is_a_load_error(tmp_path, monkeypatch):
    (tmp_path / "exiting_hooks_module.py").write_text(
        "import sys\nsys.exit('plugin gave up')\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    environ = write_config(
        tmp_path,
        f"""
[[listeners]]
target = "exiting_hooks_module:anything"
events = ["task_before"]

[[listeners]]
target = "{__name__}:plain_listener"
events = ["task_before"]
name = "still_loaded"
""",
    )
    registry = load_hooks(environ=environ, entry_points=())
    assert [x.name for x in registry.listeners] == ["still_loaded"]
    (error,) = registry.load_errors
    assert error.target == "exiting_hooks_module:anything"
    assert "SystemExit" in error.error and "plugin gave up" in error.error
    # `dueledger hooks` says so too: it once exited 1 with no JSON, as `launch` did.
    monkeypatch.setenv(ENV_HOOKS_FILE, environ[ENV_HOOKS_FILE])
    result = CliRunner().invoke(main, ["hooks", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert "exiting_hooks_module:anything" in [e["target"] for e in data["load_errors"]]


def test_a_missing_or_broken_config_file_is_a_load_error_not_a_crash(tmp_path):
    missing = load_hooks(environ={ENV_HOOKS_FILE: str(tmp_path / "nope.toml")}, entry_points=())
    assert missing.listeners == ()
    assert "does not exist" in missing.load_errors[0].error
    broken = load_hooks(environ=write_config(tmp_path, "[[listeners]\n"), entry_points=())
    assert "TOMLDecodeError" in broken.load_errors[0].error


# --- entry points: the real example plugin, registered through package metadata -------------------


def register_distribution(site: Path, name: str, entry_points: dict[str, str]) -> None:
    """Write ``<name>-0.1.0.dist-info`` (METADATA + entry_points.txt) into ``site``: exactly
    what installing the package would leave for importlib.metadata to find."""
    dist = site / f"{name.replace('-', '_')}-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n", encoding="utf-8"
    )
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (dist / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def example_plugin_installed(tmp_path, monkeypatch) -> Iterator[Path]:
    """The example plugin (tests/fixtures/example_plugin) registered with its own
    pyproject's entry points, plus a broken plugin whose module does not exist."""
    project = tomllib.loads((PLUGIN_DIR / "pyproject.toml").read_text(encoding="utf-8"))
    site = tmp_path / "site-packages"
    register_distribution(
        site,
        project["project"]["name"],
        project["project"]["entry-points"][ENTRY_POINT_GROUP],
    )
    register_distribution(site, "broken-dueledger-plugin", {"broken": "gone_plugin_module:HOOKS"})
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    importlib.invalidate_caches()
    yield site
    sys.modules.pop(PLUGIN_MODULE, None)


def test_entry_point_plugins_are_discovered_and_a_broken_one_is_reported_not_raised(
    example_plugin_installed, caplog
):
    caplog.set_level(logging.WARNING, logger=LOGGER.name)
    registry = load_hooks(environ={})
    by_name = {x.name: x for x in registry.listeners}
    assert set(by_name) == {"example:change_freeze", "example:journal"}
    assert by_name["example:change_freeze"].blocking is True
    assert by_name["example:change_freeze"].events == (BEFORE_TASK_CREATE,)
    assert by_name["example:journal"].source == SOURCE_ENTRY_POINT
    (error,) = registry.load_errors
    assert (error.source, error.name) == (SOURCE_ENTRY_POINT, "broken")
    assert "ModuleNotFoundError" in error.error and "gone_plugin_module" in error.error
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER.name]
    assert [x["hook_load_error"]["name"] for x in logged] == ["broken"]


def test_the_example_plugin_denies_frozen_tasks_and_degrades_manual_launches(
    example_plugin_installed, monkeypatch
):
    registry = load_hooks(environ={})
    monkeypatch.setenv("EXAMPLE_PLUGIN_FREEZE", "order_cleanup")
    frozen = gate_creation(create_ctx().tags, registry=registry)
    assert frozen.denied and "change freeze on order_cleanup" in (frozen.reason or "")
    manual = {t.TAG_TASK: "billing_maintenance", t.TAG_TRIGGER: Trigger.MANUAL.value}
    degraded = gate_creation(manual, registry=registry)
    assert not degraded.denied
    assert degraded.tags["example/checked_by"] == "change_freeze"


def test_the_config_file_can_disable_an_entry_point_and_demote_a_blocking_listener(
    example_plugin_installed, tmp_path
):
    environ = write_config(
        tmp_path,
        """
disable_entry_points = ["broken"]

[overrides."example:change_freeze"]
blocking = false
""",
    )
    registry = load_hooks(environ=environ)
    assert registry.load_errors == ()
    by_name = {x.name: x for x in registry.listeners}
    assert by_name["example:change_freeze"].blocking is False


def test_dueledger_hooks_lists_listeners_events_blocking_and_load_errors(
    example_plugin_installed,
):
    result = CliRunner().invoke(main, ["hooks", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["entry_point_group"] == "dueledger.hooks"
    assert set(data["events"]) == set(EVENTS)
    listeners = {x["name"]: x for x in data["listeners"]}
    assert listeners["example:change_freeze"]["blocking"] is True
    assert listeners["example:change_freeze"]["events"] == ["before_task_create"]
    assert "tick.every_slot" in listeners["example:journal"]["events"]
    assert [e["name"] for e in data["load_errors"]] == ["broken"]
    human = CliRunner().invoke(main, ["hooks"])
    assert human.exit_code == 0
    assert "example:change_freeze" in human.stdout
    assert "load error: entry_point broken" in human.stdout
