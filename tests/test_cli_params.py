"""Duration options take a finite number of seconds >= 0, process counts a whole number >= 1 or
``auto`` (roost/cli/_params.py)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from roost.cli import main
from roost._paths import usable_cores
from roost.cli._params import PROCESS_COUNT, max_processes


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


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", "", "100000", str(max_processes() + 1)])
def test_a_process_count_that_is_not_a_whole_number_or_auto_is_a_usage_error(value: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--workers", value])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--workers'" in result.output
    assert "'auto'" in result.output


def test_a_process_count_from_the_environment_is_checked_too() -> None:
    result = CliRunner().invoke(main, ["serve"], env={"ROOST_SERVE_WORKERS": "many"})
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--workers'" in result.output
    assert "(from ROOST_SERVE_WORKERS)" in result.output


@pytest.mark.parametrize(
    ("value", "count"),
    [("3", 3), (" 2 ", 2), ("auto", usable_cores()), ("AUTO", usable_cores()), (str(max_processes()), max_processes())],
)
def test_a_process_count_is_a_whole_number_or_one_per_usable_core(value: str, count: int) -> None:
    assert PROCESS_COUNT.convert(value, None, None) == count
