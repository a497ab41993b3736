"""Duration options take a finite number of seconds >= 0 (roost/cli/_params.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from roost.cli import main


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["attach", "--reconnect", "nan", "/nonexistent.sock"], "--reconnect"),
        (["attach", "--reconnect", "inf", "/nonexistent.sock"], "--reconnect"),
        (["attach", "--reconnect", "-1", "/nonexistent.sock"], "--reconnect"),
        (["attach", "--reconnect", "soon", "/nonexistent.sock"], "--reconnect"),
        (["serve", "--reconnect-grace", "nan"], "--reconnect-grace"),
        (["serve", "--kick-grace", "inf"], "--kick-grace"),
    ],
)
def test_a_duration_that_is_not_finite_is_a_usage_error(argv: list[str], option: str) -> None:
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert "seconds" in result.output


def test_a_finite_duration_passes_to_the_command() -> None:
    result = CliRunner().invoke(main, ["attach", "--reconnect", "0.5", "/nonexistent.sock"])
    # the option parsed; the command itself then fails to connect, with its own message
    assert "Invalid value" not in result.output
    assert "cannot connect" in result.output
