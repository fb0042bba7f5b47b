"""deploy/prometheus and deploy/grafana against the exporter: the rules pass `promtool test
rules` (Debian's ``prometheus`` package, which `scripts/test.sh` installs as root), the config
passes `promtool check config`, every alert is tested firing and quiet, and every metric and
label the rules, their test series and the dashboard's queries name is one that `dueledger
metrics` really writes (read back from prometheus_client's own exposition of a scrape)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestration.cli.exposition import LedgerCollector
from resources.core import metric_model as m
from resources.core.entry import Status, Trigger
from resources.core.settings import PROJECT_ROOT

PROMETHEUS = PROJECT_ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS / "dueledger.rules.yml"
RULES_TEST = PROMETHEUS / "dueledger.rules.test.yml"
DASHBOARD = PROJECT_ROOT / "deploy" / "grafana" / "dueledger-dashboard.json"
#: Labels Prometheus adds to every scraped series, and the histogram bucket bound.
TARGET_LABELS = {"job", "instance"}
#: Series Prometheus makes itself (the scrape's own health).
PROMETHEUS_OWN = {"up"}
METRIC = re.compile(r"\b(dueledger_[a-z_]+|up)\b")


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not on PATH: the alert rules are tested with `promtool test rules`. "
            "Install Debian's `prometheus` package (`apt-get install prometheus`; "
            "`scripts/test.sh` does so when run as root).",
            pytrace=False,
        )
    return path


def run_promtool(*args: str, cwd: Path = PROMETHEUS) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def exported() -> dict[str, set[str]]:
    """Every sample name the exporter writes, with its label names: a scrape of a snapshot
    with one of everything, through the CLI's collector and prometheus_client's exposition."""
    snap = m.MetricsSnapshot(
        slot_seconds=900.0,
        tasks=[
            m.TaskInfo("order_cleanup", "every 15 minutes", "strict_current_slot", "queue", "core")
        ],
        entry_counts={("order_cleanup", Status.SUCCESS, "", Trigger.SCHEDULE): 1},
        skipped={("order_cleanup", "paused"): 1},
        lags={("order_cleanup", m.STAGE_START): [3.0]},
        last_success={"order_cleanup": 1.0},
        last_due={"order_cleanup": 1.0},
        oldest_waiting_due={"order_cleanup": 1.0},
        attention=[m.AttentionEntry("order_cleanup", 7, "failed", "error", 1.0)],
        deliveries={("webhook", "failed"): 1},
        hook_failures={"task_before": 1},
        heartbeat_age=3.0,
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(lambda: snap))
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def test_the_rules_pass_promtool_test_rules_and_the_config_its_check():
    tested = run_promtool("test", "rules", RULES_TEST.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
    checked = run_promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_every_alert_is_tested_firing_and_quiet():
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    cases = [
        c
        for group in yaml.safe_load(RULES_TEST.read_text())["tests"]
        for c in group.get("alert_rule_test", [])
    ]
    for alert in alerts:
        mine = [c for c in cases if c["alertname"] == alert]
        assert [c for c in mine if c.get("exp_alerts")], f"{alert} is never tested firing"
        assert [c for c in mine if not c.get("exp_alerts")], f"{alert} is never tested quiet"


def _check_series(expr: str, names: dict[str, set[str]], where: str) -> list[str]:
    """Metric names of ``expr`` the exporter does not write (after Prometheus' own)."""
    found = METRIC.findall(expr)
    assert found or "$" in expr, f"{where}: no metric in {expr!r}"
    return [n for n in found if n not in names and n not in PROMETHEUS_OWN]


def test_the_rules_and_their_test_series_name_what_the_exporter_writes():
    names = exported()
    rules = yaml.safe_load(RULES.read_text())
    unknown = [
        bad
        for g in rules["groups"]
        for r in g["rules"]
        for bad in _check_series(r["expr"], names, r["alert"])
    ]
    assert unknown == []
    series_line = re.compile(r"^(\w+)\{(.*)\}$")
    for group in yaml.safe_load(RULES_TEST.read_text())["tests"]:
        for series in group["input_series"]:
            match = series_line.match(series["series"])
            assert match, series["series"]
            name, labels = match.group(1), set(re.findall(r"(\w+)=", match.group(2)))
            if name in PROMETHEUS_OWN:
                continue
            assert name in names, f"test series {name} is not exported"
            assert labels - TARGET_LABELS == names[name], f"{series['series']}: labels differ"


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def _targets(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(p["title"], target) for p in data["panels"] for target in p.get("targets", [])]


def test_the_dashboard_has_a_row_per_task_and_an_attention_table():
    data = dashboard()
    assert data["uid"] and data["title"] == "dueledger" and data["schemaVersion"] >= 36
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    task = variables["task"]
    assert task["includeAll"] and task["multi"]
    assert "dueledger_task_info" in task["definition"] and task["definition"].endswith(", task)")
    rows = [p for p in data["panels"] if p["type"] == "row"]
    repeated = [r for r in rows if r.get("repeat") == "task"]
    assert len(repeated) == 1 and repeated[0]["title"] == "$task"
    # The row's panels: last due, lag and outcomes of its task.
    after = [p for p in data["panels"] if p["gridPos"]["y"] > repeated[0]["gridPos"]["y"]]
    titles = {p["title"] for p in after}
    assert {"Last due", "Lag after the due (24 h of dues)", "Outcomes"} <= titles
    for panel in after:
        for target in panel["targets"]:
            assert 'task="$task"' in target["expr"], (panel["title"], target["expr"])
    (table,) = [p for p in data["panels"] if p["type"] == "table"]
    assert "dueledger_entry_needs_attention_timestamp_seconds" in table["targets"][0]["expr"]
    assert table["targets"][0]["format"] == "table"
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    for panel in data["panels"]:
        box = panel["gridPos"]
        assert box["x"] >= 0 and box["w"] >= 1 and box["x"] + box["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_every_dashboard_query_names_an_exported_metric_and_parses_as_promql(tmp_path):
    names = exported()
    targets = _targets(dashboard())
    queries = [(title, target["expr"]) for title, target in targets]
    variables = [v["definition"] for v in dashboard()["templating"]["list"] if "definition" in v]
    unknown = [bad for title, expr in queries for bad in _check_series(expr, names, title)]
    unknown += [bad for v in variables for bad in _check_series(v, names, "variable")]
    assert unknown == []
    # promtool parses each query as a recording rule (Grafana's variables made concrete).
    concrete = {"$__rate_interval": "5m", '"$task"': '"order_cleanup"', '"$instance"': '".*"'}
    rules = []
    for n, (_title, expr) in enumerate(queries):
        for variable, value in concrete.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, expr
        rules.append({"record": f"dashboard:query_{n}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run_promtool("check", "rules", str(path), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
