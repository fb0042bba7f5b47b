"""The operators' allow-list (DUELEDGER_OPERATORS): format, implied roles, local default."""

from __future__ import annotations

from pathlib import Path

import pytest

from resources.core.operators import (
    ROLE_ADMIN,
    ROLE_RETRIER,
    ROLE_VIEWER,
    ROLES,
    UI_OPERATOR,
    OperatorsFileError,
    check_operator_name,
    implied_roles,
    load_operators,
    operators_from_env,
    parse_operators,
)
from resources.core.settings import ENV_OPERATORS, SettingsError

FILE = """
[operators]
alice = ["admin"]
bob = ["retrier"]
carol = ["viewer"]
"dagster-ui" = ["retrier"]
"""


@pytest.fixture
def operators_file(tmp_path: Path) -> Path:
    path = tmp_path / "operators.toml"
    path.write_text(FILE)
    return path


def test_each_role_grants_the_ones_below_it() -> None:
    assert implied_roles({ROLE_VIEWER}) == {ROLE_VIEWER}
    assert implied_roles({ROLE_RETRIER}) == {ROLE_VIEWER, ROLE_RETRIER}
    assert implied_roles({ROLE_ADMIN}) == set(ROLES)
    assert implied_roles(set()) == frozenset()


@pytest.mark.parametrize(
    ("name", "role", "allowed"),
    [
        ("alice", ROLE_ADMIN, True),
        ("alice", ROLE_VIEWER, True),
        ("bob", ROLE_RETRIER, True),
        ("bob", ROLE_ADMIN, False),
        ("carol", ROLE_VIEWER, True),
        ("carol", ROLE_RETRIER, False),
        (UI_OPERATOR, ROLE_RETRIER, True),
        ("mallory", ROLE_VIEWER, False),
    ],
)
def test_roles_from_the_file(operators_file: Path, name: str, role: str, allowed: bool) -> None:
    decision = load_operators(str(operators_file)).check(name, role)
    assert decision.passed is allowed
    assert decision.name == f"operator_has_role_{role}"


def test_a_refusal_names_the_file_and_what_is_missing(operators_file: Path) -> None:
    operators = load_operators(str(operators_file))
    unknown = operators.check("mallory", ROLE_VIEWER)
    assert "'mallory' is not on the allow-list" in unknown.detail
    assert str(operators_file) in unknown.detail
    weak = operators.check("carol", ROLE_RETRIER)
    assert "has roles [viewer]" in weak.detail and "'retrier' (or higher) is needed" in weak.detail


def test_no_file_means_one_local_operator_with_every_role() -> None:
    for configured in (None, "", "  "):
        operators = load_operators(configured)
        assert operators.local
        assert all(operators.check("anyone", role).passed for role in ROLES)
    assert operators_from_env({}).local


def test_a_file_of_random_bytes_is_an_operators_file_error(tmp_path: Path) -> None:
    path = tmp_path / "operators.toml"
    path.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(OperatorsFileError, match="must be a UTF-8 TOML file"):
        load_operators(str(path))


def test_a_missing_file_fails_closed(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.toml")
    for load in (
        lambda: load_operators(missing),
        lambda: operators_from_env({ENV_OPERATORS: missing}),
    ):
        with pytest.raises(OperatorsFileError) as raised:
            load()
        assert f"{ENV_OPERATORS}={missing} names a file that does not exist" in str(raised.value)
        assert "unset DUELEDGER_OPERATORS" in str(raised.value)


def test_the_variable_names_the_file(operators_file: Path) -> None:
    operators = operators_from_env({ENV_OPERATORS: str(operators_file)})
    assert not operators.local
    assert operators.roles_of("bob") == {ROLE_VIEWER, ROLE_RETRIER}
    assert operators.roles_of("nobody") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alice = [", "is not valid TOML"),
        ("[people]\nalice = ['admin']", "needs an [operators] table"),
        ("[operators]\nalice = ['root']", "unknown roles ['root']"),
        ("[operators]\nalice = []", "must be a non-empty list"),
        ("[operators]\nalice = 'admin'", "must be a non-empty list"),
        ("[operators]\n\"a b\" = ['admin']", "operator name 'a b'"),
        ("[operators]\nalice = ['admin']\n[extra]\nx = 1", "unknown top-level keys"),
    ],
)
def test_a_malformed_file_is_a_settings_error(text: str, message: str) -> None:
    with pytest.raises(OperatorsFileError, match=message.replace("[", r"\[")) as info:
        parse_operators(text, "ops.toml")
    assert isinstance(info.value, SettingsError)  # the CLI maps it to exit 2


def test_operator_names_are_validated_and_stripped() -> None:
    assert check_operator_name("  alice  ") == "alice"
    assert check_operator_name("ops@example.com") == "ops@example.com"
    for bad in ("", "   ", "a b", "x' OR '1'='1", "-leading-dash"):
        with pytest.raises(ValueError, match="--operator"):
            check_operator_name(bad)
