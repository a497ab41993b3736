"""A dialect asks actors, never reads their state (issue 12, Build 4; DESIGN.md section 3).

``roost/protocol`` talks to a thread actor through messages (``actor.ref``) and its small query
interface (:data:`THREAD_ACTOR_INTERFACE`: an immutable :class:`~roost.actors.ThreadFacts`
snapshot, its view, waits); to the thread registry through its methods. These AST checks keep it
so: no dialect module reads a private attribute of another object, an expression naming a thread
actor (``actor``, ``*_actor``, ``x.actor``) uses only that interface, and no dialect module reads
the registry's state members (those its ``__init__`` assigns, bar ``services``). Each check is also
shown to fail on a planted violation.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import roost
from roost.actors import ThreadFacts, ThreadRegistry
from roost.actors._thread import ThreadActor

PROTOCOL = Path(roost.__file__).parent / "protocol"

#: What a dialect may use of a ThreadActor.
THREAD_ACTOR_INTERFACE = frozenset({"ref", "thread_id", "facts", "view", "wait_idle", "wait_turn_end"})
#: Names that hold a thread actor in dialect code.
_ACTOR_NAME = re.compile(r"(^|\.|_)actor$")
_REGISTRY_NAME = re.compile(r"(^|\.)registry$")


def _init_attributes(cls: type) -> set[str]:
    """The attributes ``cls.__init__`` assigns on ``self`` (its state members)."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and isinstance(node.ctx, ast.Store)
    }


REGISTRY_STATE = _init_attributes(ThreadRegistry) - {"services"}


def violations(source: str, name: str = "<source>") -> list[str]:
    """Every read of another object's private attribute, of a thread actor outside its interface,
    or of the registry's state, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        base = ast.unparse(node.value)
        attr = node.attr
        where = f"{name}:{node.lineno}: {base}.{attr}"
        if attr.startswith("_") and not attr.startswith("__") and base not in ("self", "cls"):
            found.append(f"{where} (a private attribute of another object)")
        elif _ACTOR_NAME.search(base) and attr not in THREAD_ACTOR_INTERFACE:
            found.append(f"{where} (thread actor state; use actor.facts() or ask actor.ref)")
        elif _REGISTRY_NAME.search(base) and attr in REGISTRY_STATE:
            found.append(f"{where} (the registry's state; use its methods)")
    return found


def test_the_dialects_read_no_actor_state() -> None:
    found = []
    for path in sorted(PROTOCOL.rglob("*.py")):
        found += violations(path.read_text(), str(path.relative_to(PROTOCOL.parent.parent)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        "if actor.active is None: pass",
        "mode = session.actor.thread.permission_mode",
        "x = source_actor.ephemeral",
        "t = self.translator._turn_id",
        "subs = self.registry.subscribers",
        "await session.runtime.registry.supervisor.terminate_child('x')",
    ],
)
def test_the_check_fails_on_a_planted_violation(planted: str) -> None:
    assert violations(planted), planted


def test_the_interface_exists_on_the_actor() -> None:
    for name in THREAD_ACTOR_INTERFACE - {"ref"}:
        assert hasattr(ThreadActor, name), name
    assert {"subscribers", "actors", "supervisor"} <= REGISTRY_STATE
    fields = {f.name for f in ThreadFacts.__attrs_attrs__}  # type: ignore[attr-defined]
    assert fields == {"thread", "cwd", "ephemeral", "running_turn_id", "stopped", "local_input_ids"}


async def test_facts_are_a_copy(tmp_path: Path) -> None:
    """Changing a snapshot's record changes nothing in the actor."""
    from roost.model import Thread
    from roost.supervisor import open_runtime
    from roost.tools import builtin_tools

    async with open_runtime(engine_for=lambda thread: None, tools=builtin_tools(), db_path=tmp_path / "r.db") as rt:
        actor = await rt.registry.create(Thread(id="thr_facts", cwd=str(tmp_path), metadata={"a": 1}), ephemeral=True)
        facts = actor.facts()
        assert (facts.id, facts.ephemeral, facts.running, facts.stopped) == ("thr_facts", True, False, False)
        assert facts.cwd == tmp_path.resolve()
        facts.thread.metadata["a"] = 2
        facts.thread.title = "changed"
        again = actor.facts()
        assert again.thread.metadata == {"a": 1} and again.thread.title is None
        await actor.wait_idle()  # idle: returns at once
