"""Tool processes do not outlive a killed Roost: PDEATHSIG on ``sh``, and start-up reaping of groups."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from roost import storage
from roost.storage import (
    list_tool_processes,
    open_store,
    reconcile,
    record_tool_process,
    tool_process_hook,
)
from roost.storage._processes import boot_id, start_ticks
from roost.tools import ToolContext, builtin_tools, run_tool
from roost.tools import _shell
from _helpers.timing import scaled

ROOT = Path(__file__).resolve().parent.parent
SHELL = builtin_tools()["shell"]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc and prctl")

#: Generous bound for anything that should happen "shortly" (signal delivery, a child starting).
DEADLINE_S = scaled(20.0)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def _wait_gone(pid: int) -> bool:
    """Poll until ``pid`` no longer runs; False if it still runs at the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.02)
    return False


def _dead_owner() -> str:
    """An owner identity of this host whose pid has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return f"{socket.gethostname()}:{proc.pid}:dead0001"


@pytest.fixture
def group() -> Iterator[subprocess.Popen]:
    """A ``sleep`` leading its own process group (pgid = pid); killed and reaped afterwards."""
    proc = subprocess.Popen(["sleep", "100"], start_new_session=True)
    try:
        yield proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[storage.Store]:
    s = open_store(tmp_path / "roost.db")
    try:
        yield s
    finally:
        s.close()


def _record(store: storage.Store, pgid: int, owner: str, ticks: int | None = None,
            boot: str | None = "this") -> None:
    ticks = start_ticks(pgid) if ticks is None else ticks
    assert ticks is not None
    with store.transaction() as conn:
        record_tool_process(conn, pgid, owner, ticks, boot_id() if boot == "this" else boot, "t1")


def _reconcile(store: storage.Store, owner: str = "me") -> storage.ReconcileReport:
    with store.transaction() as conn:
        return reconcile(conn, owner)


def _rows(store: storage.Store) -> list[dict]:
    with store.read() as conn:
        return list_tool_processes(conn)


# -- start-up reaping -----------------------------------------------------------------------------


@linux_only
def test_dead_owners_group_with_matching_start_time_is_killed(store, group) -> None:
    _record(store, group.pid, _dead_owner())
    report = _reconcile(store)
    assert report.tool_processes_killed == 1
    assert group.wait(timeout=DEADLINE_S) == -signal.SIGKILL
    assert _rows(store) == []


@linux_only
def test_mismatched_start_time_is_not_killed_but_forgotten(store, group) -> None:
    ticks = start_ticks(group.pid)
    assert ticks is not None
    _record(store, group.pid, _dead_owner(), ticks=ticks + 1)  # as if the pid had been reused
    report = _reconcile(store)
    assert report.tool_processes_killed == 0
    assert group.poll() is None and _alive(group.pid)
    assert _rows(store) == []


@linux_only
def test_live_owners_group_is_left_alone(store, group) -> None:
    owner = f"{socket.gethostname()}:{os.getpid()}:live0001"
    _record(store, group.pid, owner)
    report = _reconcile(store)
    assert report.tool_processes_killed == 0
    assert group.poll() is None and _alive(group.pid)
    assert [row["owner"] for row in _rows(store)] == [owner]


@linux_only
def test_other_hosts_rows_are_left_alone(store, group) -> None:
    owner = f"{socket.gethostname()}-elsewhere:1:other001"
    _record(store, group.pid, owner, boot="another-boot")
    assert _reconcile(store).tool_processes_killed == 0
    assert group.poll() is None
    assert [row["owner"] for row in _rows(store)] == [owner]


@linux_only
def test_rows_of_a_previous_boot_are_forgotten_without_a_kill(store, group) -> None:
    _record(store, group.pid, _dead_owner(), boot="a-previous-boot")
    assert _reconcile(store).tool_processes_killed == 0
    assert group.poll() is None
    assert _rows(store) == []


@linux_only
def test_rows_of_the_reconciling_owner_itself_are_reaped(store, group) -> None:
    # A restarted daemon with a fixed identity: what "it" recorded before is a predecessor's.
    _record(store, group.pid, "fixed-daemon")
    assert _reconcile(store, "fixed-daemon").tool_processes_killed == 1
    assert group.wait(timeout=DEADLINE_S) == -signal.SIGKILL


@linux_only
def test_group_that_outlived_its_leader_is_killed(store) -> None:
    # The shape a killed Roost leaves: sh died (PDEATHSIG), its background job did not.
    sh = subprocess.Popen(["/bin/sh", "-c", "sleep 100 & echo $!"], stdout=subprocess.PIPE,
                          start_new_session=True)
    ticks = start_ticks(sh.pid)  # sh is at least a zombie until waited for
    job = int(sh.stdout.readline())
    sh.wait()
    sh.stdout.close()
    try:
        assert ticks is not None and start_ticks(sh.pid) is None and _alive(job)
        _record(store, sh.pid, _dead_owner(), ticks=ticks)
        assert _reconcile(store).tool_processes_killed == 1
        assert _wait_gone(job)
        assert _rows(store) == []
    finally:
        if _alive(job):
            os.kill(job, signal.SIGKILL)


@linux_only
def test_leaderless_group_with_older_member_is_not_killed(store) -> None:
    sh = subprocess.Popen(["/bin/sh", "-c", "sleep 100 & echo $!"], stdout=subprocess.PIPE,
                          start_new_session=True)
    ticks = start_ticks(sh.pid)
    job = int(sh.stdout.readline())
    sh.wait()
    sh.stdout.close()
    try:
        assert ticks is not None
        # Recorded as started after its member: not the group that was recorded.
        _record(store, sh.pid, _dead_owner(), ticks=start_ticks(job) + 1000)
        assert _reconcile(store).tool_processes_killed == 0
        assert _alive(job)
    finally:
        os.kill(job, signal.SIGKILL)


# -- the shell tool's hook ------------------------------------------------------------------------


@linux_only
def _flush(conn) -> None:
    """A no-op write: awaited, every write queued before it has committed."""


async def test_hook_records_the_group_while_the_command_runs(tmp_path, store) -> None:
    owner = storage.default_owner()
    seen: list[tuple[int, bool]] = []
    hook = tool_process_hook(store.writer, owner, "t1")

    async def on_process(pgid: int, running: bool) -> None:
        seen.append((pgid, running))
        await hook(pgid, running)

    lines: list[str] = []
    printed = trio.Event()

    def on_output(chunk: str) -> None:
        lines.append(chunk)
        if "\n" in "".join(lines):
            printed.set()

    ctx = ToolContext(cwd=tmp_path, permission_mode="unconfined", on_output=on_output,
                      on_process=on_process)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.writer.run)
        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as inner:
                inner.start_soon(run_tool, SHELL, {"command": "echo $$; sleep 100"}, ctx)
                await printed.wait()
                pgid = int("".join(lines).split()[0])
                await store.writer.submit(_flush)  # the hook queues its writes; FIFO: they are in
                rows = await trio.to_thread.run_sync(_rows, store)
                intent = seen[0][0]
                assert intent < 0   # recorded before the fork, keyed by the command's marker
                assert sorted((r["pgid"], r["owner"], r["thread_id"]) for r in rows) == [
                    (intent, owner, "t1"), (pgid, owner, "t1")]
                group_row = next(r for r in rows if r["pgid"] == pgid)
                assert group_row["start_ticks"] == start_ticks(pgid)
                intent_row = next(r for r in rows if r["pgid"] == intent)
                assert intent_row["start_ticks"] <= start_ticks(pgid)
                inner.cancel_scope.cancel()
            assert seen == [(intent, True), (pgid, True), (pgid, False), (intent, False)]
            await store.writer.submit(_flush)
            assert await trio.to_thread.run_sync(_rows, store) == []
            result = await run_tool(SHELL, {"command": "echo done"}, ctx)
        assert result.output.strip() == "done"
        await store.writer.submit(_flush)
        assert await trio.to_thread.run_sync(_rows, store) == []
        nursery.cancel_scope.cancel()


async def test_a_hook_failing_after_the_start_never_fails_the_call(tmp_path) -> None:
    async def on_process(pgid: int, running: bool) -> None:
        if pgid > 0:
            raise RuntimeError("store is gone")

    ctx = ToolContext(cwd=tmp_path, permission_mode="unconfined", on_process=on_process)
    with trio.fail_after(DEADLINE_S):
        result = await run_tool(SHELL, {"command": "echo ok"}, ctx)
    assert not result.is_error and result.output.strip() == "ok"


async def test_a_command_that_cannot_be_recorded_first_is_not_started(tmp_path, store) -> None:
    # The writer never runs and is already stopped: every submit raises StoreClosed.
    writer = storage.StoreWriter(store.path)
    writer.state = storage.WriterState.STOPPED
    ctx = ToolContext(cwd=tmp_path, permission_mode="unconfined",
                      on_process=tool_process_hook(writer, "me"))
    with trio.fail_after(DEADLINE_S):
        result = await run_tool(SHELL, {"command": f"touch {tmp_path / 'ran'}"}, ctx)
    assert result.is_error and "not started" in result.output
    assert not (tmp_path / "ran").exists()


@linux_only
def test_an_intent_whose_command_ran_unrecorded_is_reaped_by_marker(store) -> None:
    # The kill landed after the fork and before the group's row: only the intent is on record.
    ticks = storage._processes.now_ticks()
    mark = 123456789
    proc = subprocess.Popen(["sleep", "100"], start_new_session=True,
                            env={**os.environ, storage._processes.MARK_ENV: str(mark)})
    try:
        owner = _dead_owner()
        with store.transaction() as conn:
            record_tool_process(conn, -mark, owner, ticks, boot_id(), "t1")
        report = _reconcile(store, storage.default_owner())
        assert report.tool_processes_killed == 1
        assert proc.wait(timeout=DEADLINE_S) == -signal.SIGKILL
        assert _rows(store) == []
    finally:
        proc.kill()
        proc.wait()


def test_the_marker_names_agree() -> None:
    assert _shell.MARK_ENV == storage._processes.MARK_ENV


@linux_only
def test_trio_process_create_is_still_there() -> None:
    # roost.tools._shell wraps a Popen forked on the trio thread (PDEATHSIG) with this private
    # constructor; trio is pinned below the next minor release. If this fails after a trio
    # upgrade, the tools-die-with-Roost guarantee is gone: fix spawn_shell before raising the pin.
    import inspect

    create = getattr(trio.Process, "_create", None)
    assert create is not None, f"trio {trio.__version__} has no Process._create"
    params = list(inspect.signature(trio.Process.__init__).parameters)
    assert params == ["self", "popen", "stdin", "stdout", "stderr"], params


# -- PDEATHSIG ------------------------------------------------------------------------------------


@linux_only
async def test_shell_forks_on_the_trio_thread(tmp_path, monkeypatch) -> None:
    # PDEATHSIG fires when the forking *thread* exits; trio's worker threads exit when idle.
    forked_on: list[int] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        forked_on.append(threading.get_ident())
        return real_popen(*args, **kwargs)

    monkeypatch.setattr(_shell.subprocess, "Popen", popen)
    ctx = ToolContext(cwd=tmp_path, permission_mode="unconfined")
    with trio.fail_after(DEADLINE_S):
        result = await run_tool(SHELL, {"command": "echo ok"}, ctx)
    assert result.output.strip() == "ok"
    assert forked_on == [threading.get_ident()]


_CHILD = r"""
import sys, trio
from pathlib import Path
from roost import storage
from roost.tools import ToolContext, builtin_tools, run_tool

def out(chunk):
    sys.stdout.write(chunk)
    sys.stdout.flush()

async def main(db, command):
    store = storage.open_store(db)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.writer.run)
        hook = storage.tool_process_hook(store.writer, storage.default_owner(), "t1")
        ctx = ToolContext(cwd=Path("."), permission_mode="unconfined", on_output=out,
                          on_process=hook)
        await run_tool(builtin_tools()["shell"], {"command": command}, ctx)

trio.run(main, sys.argv[1], sys.argv[2])
"""


def _read_ints(proc: subprocess.Popen, count: int) -> list[int]:
    """Read ``count`` lines of integers from ``proc``'s stdout, within the deadline."""
    assert proc.stdout is not None
    fd, buf = proc.stdout.fileno(), b""
    deadline = time.monotonic() + DEADLINE_S
    while buf.count(b"\n") < count:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"child printed only {buf!r}"
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"child exited after printing {buf!r} (rc={proc.wait()})"
            buf += chunk
    return [int(line) for line in buf.split(b"\n")[:count]]


def _start_child(db: Path, command: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(db), command],
                            stdout=subprocess.PIPE, cwd=ROOT)


@linux_only
def test_shell_dies_with_a_killed_roost(tmp_path) -> None:
    child = _start_child(tmp_path / "roost.db", "echo $$; sleep 100")
    try:
        [sh] = _read_ints(child, 1)
        assert _alive(sh)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert _wait_gone(sh), "sh outlived the killed process"
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


@linux_only
def test_restart_reaps_what_a_killed_roost_left_running(tmp_path) -> None:
    db = tmp_path / "roost.db"
    child = _start_child(db, "sleep 100 & echo $!; echo $$; wait")
    job = None
    try:
        job, sh = _read_ints(child, 2)  # printed after the group's row was committed
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert _wait_gone(sh)
        assert _alive(job)  # PDEATHSIG does not reach grandchildren: the store does
        with open_store(db) as store:
            pgids = sorted(row["pgid"] for row in _rows(store))
            assert len(pgids) == 2 and pgids[0] < 0 and pgids[1] == sh   # the intent and the group
            report = _reconcile(store, storage.default_owner())
            assert report.tool_processes_killed >= 1
            assert _wait_gone(job)
            assert _rows(store) == []
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        if job is not None and _alive(job):
            os.kill(job, signal.SIGKILL)
