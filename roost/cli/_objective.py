"""``roost objective``: create, list and show long-horizon objectives (wire-protocol.md appendix).

``objective create --title T [--description D] --tasks TASK [--tasks TASK ...] [--status S]``
stores an objective (id ``OBJ-0001``...) with its ordered tasks; ``objective list`` and
``objective status ID`` show them with each task's outcome. ``roost serve --auto-objective ID``
runs their remaining tasks when the daemon is idle. Each takes ``--json`` (one envelope line:
``item`` for create/status, ``items`` for list; an unknown id is the error envelope, exit 1).
"""

from __future__ import annotations

from typing import Any

import click

from roost.cli._res_common import emit_item, emit_items, fail, json_option, open_cli_store
from roost.errors import RoostError

__all__ = ["objective_group", "wire_objective"]


def wire_objective(objective: Any) -> Any:
    """The wire ``Objective`` item of a stored ``roost.storage.Objective``."""
    from roost.protocol import Objective, ObjectiveTaskInfo

    return Objective(
        id=objective.id,
        title=objective.title,
        description=objective.description,
        status=objective.status,
        created_at=objective.created_at,
        updated_at=objective.updated_at,
        tasks=[
            ObjectiveTaskInfo(
                index=t.index, task=t.task, outcome=t.outcome, failures=t.failures, session_id=t.session_id
            )
            for t in objective.tasks
        ],
    )


def _show(objective: Any) -> None:
    done = sum(1 for t in objective.tasks if t.outcome in ("succeeded", "skipped"))
    click.echo(f"{objective.id}  {objective.title}  [{objective.status}]  {done}/{len(objective.tasks)} done")
    if objective.description:
        click.echo(f"  {objective.description}")
    for t in objective.tasks:
        extra = f" (failures {t.failures})" if t.failures else ""
        click.echo(f"  {t.index + 1}. [{t.outcome}] {t.task}{extra}")


@click.group("objective", short_help="Manage long-horizon objectives run by `roost serve`.")
def objective_group() -> None:
    """Long-horizon objectives: an ordered task list run by `roost serve --auto-objective ID`."""


@objective_group.command("create", short_help="Create an objective and print its id.")
@click.option("--title", required=True, help="The objective's title.")
@click.option("--description", default=None, help="What the objective is for.")
@click.option("--tasks", "tasks", multiple=True, required=True, help="One task (repeat for each, in order).")
@click.option(
    "--status",
    type=click.Choice(["active", "paused"]),
    default="active",
    show_default=True,
    help="paused: --auto-objective leaves it alone until it is active.",
)
@json_option
def create_command(title: str, description: str | None, tasks: tuple[str, ...], status: str, as_json: bool) -> None:
    """Create an objective; prints its id (or the Objective item with --json)."""
    from roost.storage import create_objective

    try:
        with open_cli_store("objective create", as_json=as_json) as store, store.transaction() as conn:
            objective = create_objective(conn, title=title, description=description, tasks=list(tasks), status=status)
    except RoostError as exc:
        fail("objective create", str(exc), as_json=as_json)
    if as_json:
        emit_item(wire_objective(objective))
    else:
        click.echo(objective.id)


@objective_group.command("list", short_help="List objectives in id order.")
@click.option(
    "--status",
    type=click.Choice(["active", "paused", "completed"]),
    default=None,
    help="Only objectives with this status.",
)
@json_option
def list_command(status: str | None, as_json: bool) -> None:
    """List objectives in id order (Objective items with --json)."""
    from roost.storage import list_objectives

    try:
        with open_cli_store("objective list", as_json=as_json) as store, store.read() as conn:
            objectives = list_objectives(conn, status=status)
    except RoostError as exc:
        fail("objective list", str(exc), as_json=as_json)
    if as_json:
        emit_items(wire_objective(o) for o in objectives)
        return
    if not objectives:
        click.echo("no objectives")
    for objective in objectives:
        _show(objective)


@objective_group.command("status", short_help="Show one objective and each task's outcome.")
@click.argument("objective_id")
@json_option
def status_command(objective_id: str, as_json: bool) -> None:
    """Show one objective with each task's outcome (an Objective item with --json)."""
    from roost.storage import get_objective

    try:
        with open_cli_store("objective status", as_json=as_json) as store, store.read() as conn:
            objective = get_objective(conn, objective_id)
    except RoostError as exc:
        fail("objective status", str(exc), as_json=as_json)
    if as_json:
        emit_item(wire_objective(objective))
    else:
        _show(objective)


#: Each sub-command's --help ends with the exit statuses (issue 17: every command documents them).
for _command in objective_group.commands.values():
    _command.epilog = _command.epilog or (
        "Exit status: 0 on success; 1 on failure (an unknown objective id, an empty title or task; with "
        "--json an error envelope on stdout); 2 for a usage error, or without --json an unusable "
        "ROOST_HOME or database (with --json: exit 1, as the wire protocol fixes)."
    )
del _command
