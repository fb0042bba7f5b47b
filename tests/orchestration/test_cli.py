"""`dueledger tasks`, `launch` and `sample-data`: exit codes and JSON shapes."""

from __future__ import annotations

import json
from dataclasses import replace

import dagster as dg
import pytest
from click.testing import CliRunner

from orchestration.cli import main
from orchestration.declarations import registered_tasks
from orchestration.manual_launch import launch_manual
from orchestration.services.hooks.registry import Hooks
from orchestration.services.launch import manual_run_id
from resources.core.errors import Refused
from resources.core.settings import mask_url
from resources.ledger import RunLedger


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout


def test_tasks_json_lists_every_task_with_declared_and_effective_cadence():
    code, out = invoke("tasks", "--json")
    assert code == 0
    rows = json.loads(out)
    assert [r["key"] for r in rows] == [t.key for t in registered_tasks()]
    for row in rows:
        assert {"key", "rule", "declared_cadence", "effective_cadence", "manual_trigger"} <= set(
            row
        )
        assert {"timeout_seconds", "lease_ttl_seconds", "max_attempts"} <= set(row)
        assert {"missed_slot_policy", "overlap_policy"} <= set(row)


def test_tasks_human_output_is_a_table_with_a_header():
    code, out = invoke("tasks")
    assert code == 0
    assert out.splitlines()[0].startswith("KEY")
    assert "order_cleanup" in out


def test_launch_of_an_unknown_task_is_exit_2_with_a_json_error():
    code, out = invoke("launch", "no_such_task", "--operator", "ops", "--reason", "x", "--json")
    assert code == 2
    assert "unknown task 'no_such_task'" in json.loads(out)["error"]


def test_launch_without_operator_is_invalid_input():
    code, _ = invoke("launch", "order_cleanup", "--reason", "x")
    assert code == 2


def test_a_task_that_is_not_manually_triggerable_is_refused_and_nothing_is_launched(tmp_path):
    specs = tuple(replace(t, manual_trigger=False) for t in registered_tasks())
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    ledger.migrate()
    submitted: list[str] = []
    with dg.instance_for_test() as instance, pytest.raises(Refused, match="manual_trigger: true"):
        launch_manual(
            specs,
            "order_cleanup",
            operator="ops",
            reason="x",
            request_id="r",
            instance=instance,
            ledger=ledger,
            hooks=Hooks.from_environment(),
            submit=lambda job, run_id, tags: submitted.append(run_id),
        )
    assert submitted == []
    assert ledger.find("order_cleanup", "manual:r") is None


def test_manual_run_ids_are_stable_per_task_and_request():
    assert manual_run_id("order_cleanup", "r1") == manual_run_id("order_cleanup", "r1")
    assert manual_run_id("order_cleanup", "r1") != manual_run_id("order_cleanup", "r2")
    assert manual_run_id("order_cleanup", "r1") != manual_run_id("other_task", "r1")


def test_sample_data_refuses_to_overwrite_with_exit_3(monkeypatch, tmp_path):
    monkeypatch.setenv("DUELEDGER_SOURCE_URL", f"sqlite:///{tmp_path / 'src.sqlite'}")
    code, out = invoke(
        "sample-data", "--services", "20", "--as-of", "2026-11-30T00:00:00Z", "--json"
    )
    assert code == 0 and json.loads(out)["services"] == 20
    code, out = invoke("sample-data", "--services", "20", "--json")
    assert code == 3
    assert "--replace" in json.loads(out)["error"]


def test_sample_data_rejects_a_malformed_as_of_with_exit_2(monkeypatch, tmp_path):
    monkeypatch.setenv("DUELEDGER_SOURCE_URL", f"sqlite:///{tmp_path / 'src.sqlite'}")
    code, out = invoke("sample-data", "--as-of", "yesterday", "--json")
    assert code == 2
    assert "--as-of 'yesterday'" in json.loads(out)["error"]


def test_mask_url_hides_the_password_and_secret_query_values():
    assert (
        mask_url("postgresql+psycopg2://u:pw@h:5432/db") == "postgresql+psycopg2://u:***@h:5432/db"
    )
    masked = mask_url("postgresql://u@h/db?sslmode=require&password=pw&Auth_Token=t")
    assert "pw" not in masked and "=t" not in masked
    assert "sslmode=require" in masked
    assert mask_url("sqlite:////tmp/x.sqlite") == "sqlite:////tmp/x.sqlite"
    assert mask_url("not a url") == "<unparseable database URL>"
    # An unencoded @ in the password: SQLAlchemy would show what follows it as the host.
    for url in ("postgresql://u:p@zz@h/db", "postgresql://u:p@q@zz@h:5432/db?sslmode=x"):
        masked = mask_url(url)
        assert masked.startswith("postgresql://u:***@h") and "zz" not in masked, masked


@pytest.mark.parametrize(
    ("variable", "args"),
    [("DUELEDGER_SOURCE_URL", ["sample-data"]), ("DUELEDGER_DATABASE_URL", ["runs", "list"])],
)
def test_a_url_with_an_unencoded_at_in_its_password_is_invalid_input_that_hides_it(
    monkeypatch, tmp_path, variable, args
):
    # The driver took what follows the first @ for the host and printed it in its error:
    # 'could not translate host name "secret@nohost.invalid"'.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(variable, "postgresql+psycopg2://u:top@secret@nohost.invalid/db")
    code, out = invoke(*args, "--json")
    assert code == 2, out
    message = json.loads(out)["error"]
    assert "secret" not in message and "top" not in message
    assert f"{variable}=postgresql+psycopg2://u:***@nohost.invalid/db" in message
    assert "%40" in message


@pytest.mark.parametrize(
    "url",
    [
        "sqlite:///{blocker}/ledger.sqlite",  # a path under a regular file
        "mysql://u@localhost/ledger",  # a backend the ledger does not support
        "not a url",
    ],
)
def test_a_ledger_url_that_cannot_work_is_invalid_input_naming_the_fix(monkeypatch, tmp_path, url):
    # A SQLite ledger path under a regular file was exit 1 (unexpected): it is the user's
    # setting, so exit 2 naming DUELEDGER_DATABASE_URL.
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DUELEDGER_DATABASE_URL", url.format(blocker=blocker))
    code, out = invoke("runs", "list", "--json")
    assert code == 2, out
    assert "DUELEDGER_DATABASE_URL" in json.loads(out)["error"]
    assert blocker.read_text() == "not a folder"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sample-data", "--seed", "abc", "--json"], "'abc' is not a valid integer"),
        # A negative seed was exit 3 with numpy's "expected non-negative integer".
        (["sample-data", "--seed", "-1", "--json"], "Invalid value for '--seed': -1"),
        (["runs", "show", "--json"], "Missing argument"),
        (["sample-data", "--services", "0", "--json"], "--services"),
        (["summary", "--no-such-option", "--json"], "No such option"),
    ],
)
def test_usage_errors_under_json_print_a_json_error_with_exit_2(args, expected):
    code, out = invoke(*args)
    assert code == 2
    assert expected in json.loads(out)["error"]
