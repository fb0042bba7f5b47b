"""`dueledger sample-data --replace`: demo data is replaced without asking; a PostgreSQL
store, or rows sample-data did not generate, only with --yes-delete-everything.

Through click's CliRunner on a real SQLite and a real PostgreSQL source store; the local
platform's work on the sample is real task runs (dg.materialize with the tasks' tags).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from hook_support import build
from sqlalchemy.engine import make_url

from assets.domain_config import DomainRules
from orchestration.cli import main
from resources.core import tags as t
from resources.core.due import format_due
from resources.core.entry import Trigger
from resources.core.settings import ENV_SOURCE_URL, mask_url
from resources.ledger import RunLedger
from resources.notifier import OutboxNotifier
from resources.source_schema import SOURCE_TABLES, customers, orders, sample_data_generated
from resources.source_store import SourceStore

AS_OF = datetime(2026, 11, 30, tzinfo=UTC)
FLAG = "--yes-delete-everything"

# The code location's assets, built with this environment's plugin hooks.
service_auto_renew = build("service_auto_renew")
billing_maintenance = build("billing_maintenance")
order_cleanup = build("order_cleanup")


def sample_data(*args: str, code: int = 0) -> dict[str, object]:
    result = CliRunner().invoke(main, ["sample-data", "--as-of", format_due(AS_OF), *args])
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    data: dict[str, object] = json.loads(result.stdout)
    return data


def refusal(*args: str) -> str:
    """The error of a refused (exit 3) sample-data run."""
    data = sample_data(*args, code=3)
    assert set(data) == {"error"}
    return str(data["error"])


def table_rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every business table, to show that nothing changed."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table.name: [
                    tuple(row) for row in conn.execute(sa.select(table).order_by(table.c.id))
                ]
                for table in SOURCE_TABLES
            }
    finally:
        engine.dispose()


def execute(url: str, *statements: sa.Executable) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.execute(statement)
    finally:
        engine.dispose()


@pytest.fixture
def sqlite_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    url = f"sqlite:///{tmp_path / 'source.sqlite'}"
    monkeypatch.setenv(ENV_SOURCE_URL, url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    yield url


def test_demo_data_a_local_platform_worked_on_is_replaced_without_asking(
    sqlite_source: str, tmp_path: Path
) -> None:
    sample_data("--services", "80", "--json")
    generated = table_rows(sqlite_source)
    source = SourceStore(url=sqlite_source)
    ledger = RunLedger(database_url=f"sqlite:///{tmp_path / 'ledger.sqlite'}")
    resources = {
        "source": source,
        "ledger": ledger,
        "notifier": OutboxNotifier(),
        "rules": DomainRules(),
    }
    with dg.instance_for_test() as instance:
        for asset, task, partition in (
            (service_auto_renew, "service_auto_renew", None),
            (order_cleanup, "order_cleanup", None),
            (billing_maintenance, "billing_maintenance", AS_OF.strftime("%Y-%m-%d")),
        ):
            tags = {t.TAG_TASK: task, t.TAG_TRIGGER: Trigger.SCHEDULE.value}
            tags[t.TAG_DUE] = format_due(AS_OF)
            result = dg.materialize(
                [asset], resources=resources, instance=instance, tags=tags, partition_key=partition
            )
            assert result.success
    ledger.dispose()
    source.engine().dispose()
    worked_on = table_rows(sqlite_source)
    # The tasks changed the demo rows and added renewal invoices beyond the generated ids.
    assert len(worked_on["invoices"]) > len(generated["invoices"])
    assert worked_on["orders"] != generated["orders"]

    data = sample_data("--services", "30", "--replace", "--json")

    assert data["services"] == 30
    assert {name: len(rows) for name, rows in table_rows(sqlite_source).items()} == {
        name: data[name] for name in worked_on
    }


@pytest.mark.parametrize(
    ("foreign", "held"),
    [
        (
            [
                sa.insert(customers).values(
                    name="Real Customer", email="r@example.org", phone="+1", balance_cents=0
                ),
                sa.insert(orders).values(
                    customer_id=1, product="domain", status="pending", created_at=AS_OF
                ),
            ],
            "sample-data did not generate 1 customers, 1 orders of them (seed 7, 20 services, "
            "as of 2026-11-30T00:00:00Z), nor did a dueledger task add them",
        ),
        # A store filled before sample-data kept its record, or by something else.
        ([sa.delete(sample_data_generated)], "sample-data has no record of generating any"),
    ],
    ids=["rows added by someone", "no record"],
)
def test_rows_sample_data_did_not_generate_are_deleted_only_with_the_flag(
    sqlite_source: str, foreign: list[sa.Executable], held: str
) -> None:
    sample_data("--services", "20", "--json")
    execute(sqlite_source, *foreign)
    before = table_rows(sqlite_source)

    message = refusal("--services", "30", "--replace", "--json")

    assert f"{sqlite_source} holds rows sample-data did not generate" in message
    assert held in message
    assert f"repeat with --replace {FLAG}. Nothing was changed." in message
    assert table_rows(sqlite_source) == before
    data = sample_data("--services", "30", "--replace", FLAG, "--json")
    assert {name: len(rows) for name, rows in table_rows(sqlite_source).items()} == {
        name: data[name] for name in before
    }


@pytest.mark.postgres
def test_a_postgresql_store_is_replaced_only_with_the_flag(
    postgres_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The throwaway server trusts local connections, so a password in the URL is accepted
    # and must still appear nowhere in what the command prints.
    url = make_url(postgres_url).set(password="s3cret-pw").render_as_string(hide_password=False)
    monkeypatch.setenv(ENV_SOURCE_URL, url)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    message = refusal("--services", "5", "--replace", "--json")  # even an empty one
    assert "It holds no rows yet, so there is nothing to replace" in message
    sample_data("--services", "5", "--json")
    before = table_rows(postgres_url)

    message = refusal("--services", "7", "--replace", "--json")

    assert f"{mask_url(url)} is a server database, which may be shared or production" in message
    assert "sample-data generated them (seed 7, 5 services" in message
    assert f"repeat with --replace {FLAG}" in message and "s3cret" not in message
    assert table_rows(postgres_url) == before
    for args in (("--json",), ()):
        result = CliRunner().invoke(
            main, ["sample-data", "--services", "7", "--replace", FLAG, *args]
        )
        assert result.exit_code == 0, result.output
        assert "s3cret" not in result.output and "***" in result.output
    assert len(table_rows(postgres_url)["services"]) == 7


def test_the_flag_without_replace_is_invalid_input(sqlite_source: str) -> None:
    data = sample_data(FLAG, "--json", code=2)
    assert "--yes-delete-everything only applies to --replace" in str(data["error"])
    assert not Path(str(make_url(sqlite_source).database)).exists()  # nothing was made
