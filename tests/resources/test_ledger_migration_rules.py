"""Read from the migrations' own source: a ledger migration only adds.

What ``upgrade()`` of a revision may do, checked on its AST (nothing is run):

- create tables and indexes, add columns -- nullable or with a ``server_default``, so that
  the code of the previous revision, which knows nothing of the column, can still insert rows
  during a rolling upgrade (tests/resources/test_ledger_rolling_upgrade.py);
- alter a column only to widen it: ``nullable=True``, or a type that holds every old value
  (``String(n)`` to a longer ``String`` or ``Text``, ``Integer`` to ``BigInteger``), saying
  the ``existing_type``;
- never drop, rename or delete anything: no ``drop_*``, ``rename_table``, no
  ``DELETE``/``DROP``/``TRUNCATE`` through ``op.execute``.

The rule is a function of the source text, so a test feeds it migrations that break it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

VERSIONS = Path(__file__).resolve().parents[2] / "resources" / "ledger" / "migrations" / "versions"
WIDER = {
    ("String", "String"),
    ("String", "Text"),
    ("Integer", "BigInteger"),
    ("SmallInteger", "Integer"),
    ("SmallInteger", "BigInteger"),
}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else None


def _type(node: ast.expr | None) -> tuple[str | None, int | None]:
    """``sa.String(200)`` -> ("String", 200); ``sa.Text()`` -> ("Text", None)."""
    if isinstance(node, ast.Call):
        length = (
            node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
        )
        return _call_name(node), length if isinstance(length, int) else None
    if isinstance(node, ast.Attribute):
        return node.attr, None
    return None, None


def _keywords(node: ast.Call) -> dict[str, ast.expr]:
    return {k.arg: k.value for k in node.keywords if k.arg}


def _widens(call: ast.Call) -> str | None:
    """Why an ``alter_column`` is not a widening, or None when it is one."""
    kw = _keywords(call)
    allowed = {"nullable", "type_", "existing_type", "existing_nullable", "existing_server_default"}
    if extra := sorted(set(kw) - allowed):
        return f"alter_column with {', '.join(extra)}"
    if "nullable" in kw and not (isinstance(kw["nullable"], ast.Constant) and kw["nullable"].value):
        return "alter_column to NOT NULL"
    if "type_" in kw:
        new, new_length = _type(kw["type_"])
        old, old_length = _type(kw.get("existing_type"))
        if old is None:
            return "alter_column type_ without existing_type"
        if (old, new) not in WIDER and old != new:
            return f"alter_column {old} -> {new}"
        if old == new == "String" and (new_length or 0) < (old_length or 0):
            return f"alter_column String({old_length}) -> String({new_length})"
    return None


def _column_problem(call: ast.Call) -> str | None:
    """An added column the previous revision's code could not insert rows without."""
    column = call.args[-1] if call.args else None
    if not isinstance(column, ast.Call):
        return None
    kw = _keywords(column)
    nullable = kw.get("nullable")
    not_null = isinstance(nullable, ast.Constant) and nullable.value is False
    if not_null and "server_default" not in kw:
        name = (
            column.args[0].value
            if column.args and isinstance(column.args[0], ast.Constant)
            else "?"
        )
        return f"add_column {name!r} NOT NULL without a server_default"
    return None


def violations(source: str) -> list[str]:
    """What the ``upgrade()`` of a migration's source does besides adding (empty: only adds)."""
    tree = ast.parse(source)
    upgrade = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "upgrade"), None
    )
    if upgrade is None:
        return ["no upgrade() function"]
    found = []
    for node in ast.walk(upgrade):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node) or ""
        if name.startswith(("drop_", "rename")):
            found.append(f"{name} (line {node.lineno})")
        elif name == "alter_column":
            if (why := _widens(node)) is not None:
                found.append(f"{why} (line {node.lineno})")
        elif name == "execute":
            text = ast.unparse(node).upper()
            for word in ("DELETE", "DROP", "TRUNCATE"):
                if word in text:
                    found.append(f"execute with {word} (line {node.lineno})")
        elif name == "add_column" and (why := _column_problem(node)) is not None:
            found.append(f"{why} (line {node.lineno})")
    return found


MIGRATIONS = sorted(VERSIONS.glob("[0-9]*.py"))


@pytest.mark.parametrize("path", MIGRATIONS, ids=[p.stem for p in MIGRATIONS])
def test_every_ledger_migration_only_adds(path: Path) -> None:
    assert violations(path.read_text()) == []


def test_there_are_migrations_to_check() -> None:
    assert len(MIGRATIONS) >= 4


UPGRADE = "from alembic import op\nimport sqlalchemy as sa\n\ndef upgrade() -> None:\n    {}\n"
BREAKING = {
    "drop a column": 'op.drop_column("dueledger_entries", "error")',
    "drop a table": 'op.drop_table("dueledger_audit")',
    "drop an index": 'op.drop_index("ix_dueledger_audit_at", "dueledger_audit")',
    "rename a table": 'op.rename_table("dueledger_audit", "audit")',
    "delete rows": "op.execute(\"DELETE FROM dueledger_entries WHERE status = 'success'\")",
    "truncate": 'op.execute(sa.text("truncate dueledger_audit"))',
    "narrow a string": (
        'op.alter_column("dueledger_entries", "task_key", type_=sa.String(50), '
        "existing_type=sa.String(200))"
    ),
    "change a type": (
        'op.alter_column("dueledger_entries", "attempt", type_=sa.String(10), '
        "existing_type=sa.Integer())"
    ),
    "make a column required": 'op.alter_column("dueledger_entries", "error", nullable=False)',
    "a required column the old code cannot fill": (
        'op.add_column("dueledger_entries", sa.Column("tenant", sa.String(64), nullable=False))'
    ),
    "drop inside a batch": (
        'with op.batch_alter_table("dueledger_entries") as b:\n        b.drop_column("error")'
    ),
}
ADDS = {
    "a nullable column": 'op.add_column("dueledger_entries", sa.Column("tenant", sa.String(64)))',
    "a required column with a default": (
        'op.add_column("dueledger_entries", sa.Column("tenant", sa.String(64), nullable=False, '
        'server_default="default"))'
    ),
    "a wider string": (
        'op.alter_column("dueledger_entries", "task_key", type_=sa.String(400), '
        "existing_type=sa.String(200))"
    ),
    "a string to text": (
        'op.alter_column("dueledger_entries", "operator", type_=sa.Text(), '
        "existing_type=sa.String(200))"
    ),
    "a column made optional": 'op.alter_column("dueledger_entries", "trigger", nullable=True)',
    "an index": 'op.create_index("ix_x", "dueledger_entries", ["due"])',
}


@pytest.mark.parametrize("body", BREAKING.values(), ids=list(BREAKING))
def test_the_rule_catches_a_migration_that_takes_something_away(body: str) -> None:
    assert violations(UPGRADE.format(body)), body


@pytest.mark.parametrize("body", ADDS.values(), ids=list(ADDS))
def test_the_rule_lets_a_migration_that_only_adds_pass(body: str) -> None:
    assert violations(UPGRADE.format(body)) == []


def test_each_revision_is_named_after_its_file_and_the_head_needs_no_alembic() -> None:
    # migration_head() reads the folder (every command start pays for it); Alembic must agree.
    from alembic.script import ScriptDirectory

    from resources.ledger.migrate import MIGRATIONS_DIR, migration_head

    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    for script in scripts.walk_revisions():
        assert script.path is not None
        assert script.revision == Path(script.path).stem, script.path
    assert migration_head() == scripts.get_current_head()
