"""Tool process groups in the store (migration 0003), so a restart can kill a dead process's leftovers.

A shell tool call runs its command in a process group of its own (``start_new_session=True``), so
the group does not die with Roost. Each running group is a row ``tool_processes(pgid, owner,
start_ticks, boot_id, thread_id, started_at)``:

* ``pgid``: the process group id (= the group leader's pid), or, for an *intent* recorded before
  the fork, minus the command's marker (``ROOST_TOOL_MARK`` in its environment);
* ``owner``: the lease owner identity of the Roost process that started it
  (``"<host>:<pid>:<nonce>"``, :func:`roost.storage.default_owner`);
* ``start_ticks``: (an intent: the clock ticks when it was recorded; no process of the command
  started earlier) the leader's start time, field 22 (``starttime``) of ``/proc/<pgid>/stat``, in
  clock ticks since boot: with ``boot_id`` it tells the recorded leader from a later process that
  reuses its pid;
* ``boot_id``: ``/proc/sys/kernel/random/boot_id`` (``NULL`` where unknown);
* ``thread_id``: the Roost thread whose tool call started it (``NULL`` outside threads).

:func:`tool_process_hook` makes the ``ToolContext.on_process`` callback that inserts a row when a
group starts and deletes it when the tool call is done with it; :func:`reap_tool_processes` (run by
:func:`roost.storage.reconcile` at start-up) SIGKILLs the groups of dead owners of this host and
deletes their rows. Linux only in effect: without ``/proc`` no row is written.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from roost.errors import StoreBusy

from ._portable import execute
from ._rows import utc_now
from .leases import hostname as _hostname
from .leases import owner_is_dead

if TYPE_CHECKING:  # the writer (and trio) load only when a hook is made: `roost sessions` needs neither
    from ._writer import StoreWriter

#: The environment variable that marks every process of one shell command (the shell tool's).
MARK_ENV = "ROOST_TOOL_MARK"

__all__ = [
    "ProcessHook",
    "boot_id",
    "forget_tool_process",
    "list_tool_processes",
    "reap_tool_processes",
    "record_tool_process",
    "start_ticks",
    "tool_process_hook",
]


def _warn(message: str, *args: object, exc_info: bool = False) -> None:
    """Log a warning on the ``roost.storage`` logger; logging is imported on the first one, so a
    command that only reads the store (``roost sessions --json``) never loads it (issue 19)."""
    import logging

    logging.getLogger("roost.storage").warning(message, *args, exc_info=exc_info, stacklevel=2)


#: ``async (pgid, running) -> None``: ``running`` is True when the group started, False when the
#: tool call is done with it (the shape of ``ToolContext.on_process``).
ProcessHook = Callable[[int, bool], Awaitable[None]]


#: Seconds the hook waits for its insert to commit before giving up (it may still commit).
_HOOK_TIMEOUT_S = 5.0

_COLUMNS = ("pgid", "owner", "start_ticks", "boot_id", "thread_id", "started_at")


def _stat_fields(pid: int) -> list[bytes] | None:
    """Return the fields of ``/proc/<pid>/stat`` after ``comm`` (``state`` is index 0), or None.

    ``comm`` may hold spaces and parentheses, so the split starts after its last ``)``. Field N of
    proc(5) (1-based) is index ``N - 3``. None when the process (or procfs) does not exist.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Return the start time of process ``pid`` in clock ticks since boot, or None.

    Field 22 (``starttime``) of ``/proc/<pid>/stat``; a zombie still has it. None when the process
    is gone or there is no procfs. Blocking but cheap (one small read).
    """
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20:
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


@functools.lru_cache(maxsize=1)
def boot_id() -> str | None:
    """Return this boot's id (``/proc/sys/kernel/random/boot_id``), or None where unknown."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def now_ticks() -> int | None:
    """The current time in clock ticks since boot (``/proc/uptime``), one tick early; None without procfs."""
    try:
        with open("/proc/uptime", "rb") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0, int(uptime * os.sysconf("SC_CLK_TCK")) - 1)


def _marked_processes(mark: int, since: int) -> list[int]:
    """The pids of running processes whose environment holds ``ROOST_TOOL_MARK=<mark>`` and that
    started at or after ``since`` (clock ticks since boot): a recorded intent's command and all it
    started. Processes of other users (unreadable ``environ``) are skipped."""
    needle = f"{MARK_ENV}={mark}".encode()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue
        if needle not in environ.split(b"\0"):
            continue
        fields = _stat_fields(int(entry))
        if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
            continue
        try:
            if int(fields[19]) >= since:
                found.append(int(entry))
        except ValueError:
            continue
    return found


def _kill_marked(mark: int, since: int) -> bool:
    """SIGKILL every process carrying ``mark`` (:func:`_marked_processes`); True when any was found."""
    pids = _marked_processes(mark, since)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            _warn("cannot kill leftover tool process %d (marker %d)", pid, mark)
    return bool(pids)


def _group_members(pgid: int) -> list[int]:
    """Return the start ticks of the running (not zombie) members of process group ``pgid``.

    Scans ``/proc``; an empty list when the group has no running member or there is no procfs.
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    members = []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # state is index 0, pgrp index 2, starttime index 19.
        if fields is None or len(fields) < 20 or fields[0] in (b"Z", b"X"):
            continue
        try:
            if int(fields[2]) == pgid:
                members.append(int(fields[19]))
        except ValueError:
            continue
    return members


def _is_recorded_group(pgid: int, ticks: int) -> bool:
    """Whether process group ``pgid`` still runs and is the one whose leader started at ``ticks``.

    * The leader (pid ``pgid``) exists, even as a zombie: it is the recorded one only if it
      started at ``ticks`` (a different start time means the pid was reused, and a pid number is
      not reused while a group of that id has members, so the recorded group is gone).
    * The leader is gone but members remain (the usual case after a kill: the leader ``sh`` died
      of PDEATHSIG, its background children did not): the group is the recorded one when no
      member started before ``ticks`` (a member of the recorded group cannot predate its
      leader). Residual risk, accepted: within one boot, the recorded group ended, its id was
      reused by a new session leader, and that leader exited leaving members behind.

    Callers check first that the recorded boot is this boot.
    """
    members = _group_members(pgid)
    if not members:
        return False
    leader = start_ticks(pgid)
    if leader is not None:
        return leader == ticks
    return min(members) >= ticks


def _host_of(owner: str) -> str | None:
    parts = owner.rsplit(":", 2)
    return parts[0] if len(parts) == 3 and parts[1].isdigit() else None


def record_tool_process(
    conn: Any,
    pgid: int,
    owner: str,
    ticks: int,
    boot: str | None = None,
    thread_id: str | None = None,
) -> None:
    """Insert (or replace) the row of a running tool process group (a writer).

    Args:
        conn: a connection in a write transaction (e.g. through :meth:`StoreWriter.submit`).
        pgid: the process group id (its leader's pid).
        owner: the lease owner identity of the process that started the group.
        ticks: the leader's start time in clock ticks since boot (:func:`start_ticks`).
        boot: the boot id (:func:`boot_id`), or None.
        thread_id: the Roost thread of the tool call, or None.
    """
    execute(
        conn,
        """INSERT INTO tool_processes (pgid, owner, start_ticks, boot_id, thread_id, started_at)
           VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT (owner, pgid) DO UPDATE SET start_ticks = excluded.start_ticks,
               boot_id = excluded.boot_id, thread_id = excluded.thread_id,
               started_at = excluded.started_at""",
        (pgid, owner, ticks, boot, thread_id, utc_now()),
    )


def forget_tool_process(conn: Any, pgid: int, owner: str) -> bool:
    """Delete the row of ``owner``'s group ``pgid`` (a writer); True when there was one."""
    cur = execute(conn, "DELETE FROM tool_processes WHERE owner = ? AND pgid = ?", (owner, pgid))
    return cur.rowcount == 1


def list_tool_processes(conn: Any, owner: str | None = None) -> list[dict]:
    """Return the recorded groups (all, or ``owner``'s) as dicts of the columns, oldest first."""
    sql = f"SELECT {', '.join(_COLUMNS)} FROM tool_processes"
    rows = (
        execute(conn, sql + " WHERE owner = ? ORDER BY started_at", (owner,))
        if owner is not None
        else execute(conn, sql + " ORDER BY started_at")
    )
    return [dict(zip(_COLUMNS, row, strict=True)) for row in rows]


def reap_tool_processes(conn: Any, owner: str) -> int:
    """Kill the tool process groups a dead process of this host left running; forget their rows.

    For each row of this host (its owner's host part is this host's name):

    * recorded in another boot (``boot_id`` differs): nothing of it can run; the row is deleted;
    * owner is ``owner`` (a restarted process with a fixed identity) or a dead process
      (:func:`~roost.storage.leases.owner_is_dead`): when the group still runs and is the recorded
      one (:func:`_is_recorded_group`: the leader's start time matches ``start_ticks``, or the
      leader is gone and no member predates it), it gets SIGKILL (``os.killpg``); the row is
      deleted either way;
    * otherwise (a live owner, or one whose pid was recycled) the row is left alone.

    Rows of other hosts are left alone. Without procfs no group is recognised, so none is killed.

    Args:
        conn: a write-capable connection (its own statements are autocommit, or a transaction's).
        owner: this process's lease owner identity.

    Returns:
        The number of process groups that were sent SIGKILL.
    """
    this_host, this_boot = _hostname(), boot_id()
    killed = 0
    for row in list_tool_processes(conn):
        holder = row["owner"]
        if holder != owner and _host_of(holder) != this_host:
            continue
        same_boot = row["boot_id"] is None or this_boot is None or row["boot_id"] == this_boot
        if same_boot and holder != owner and not owner_is_dead(holder):
            continue
        if same_boot and row["pgid"] < 0:
            # An intent: the command may have started (or not) before its group was recorded.
            killed += _kill_marked(-row["pgid"], row["start_ticks"])
        elif same_boot and _is_recorded_group(row["pgid"], row["start_ticks"]):
            try:
                os.killpg(row["pgid"], signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass  # it ended meanwhile
            except PermissionError:
                _warn("cannot kill leftover tool process group %d (owner %s)", row["pgid"], holder)
        forget_tool_process(conn, row["pgid"], holder)
    return killed


def tool_process_hook(writer: StoreWriter, owner: str, thread_id: str | None = None) -> ProcessHook:
    """Return a ``ToolContext.on_process`` callback that records groups through ``writer``.

    ``await hook(pgid, True)`` inserts the row (:func:`record_tool_process`; skipped when the
    leader's start time cannot be read: no procfs) and waits for its commit, at most 5 s, so a
    Roost killed while the command runs leaves a row to reap by. ``await hook(pgid, False)``
    queues the delete without waiting (:meth:`StoreWriter.submit_nowait`; the queue is FIFO, so it
    never overtakes its insert): a row left behind is harmless, as it is checked against the
    group's start time before anything is killed. A failed or timed-out write is logged and
    otherwise ignored: it never fails the tool call.

    Args:
        writer: the process's :class:`StoreWriter` (running).
        owner: this process's lease owner identity (``"<host>:<pid>:<nonce>"``).
        thread_id: the Roost thread the tool calls belong to, or None.

    An *intent* (``pgid`` < 0: minus the marker of a command about to start, see
    :mod:`roost.tools._shell`) is recorded with the current clock ticks and waited for; unlike the
    others, its failure is raised (:class:`StoreBusy` on a timeout, or the writer's error), so the
    command is not started.

    Cancellation:
        The hook is a checkpoint; cancelled, its write may still commit.
    """
    import trio

    async def hook(pgid: int, running: bool) -> None:
        if pgid < 0 and running:
            await _record_intent(pgid)
            return
        try:
            if not running:
                writer.submit_nowait(forget_tool_process, pgid, owner)
                await trio.lowlevel.checkpoint()
                return
            ticks = start_ticks(pgid)
            if ticks is None:
                return
            with trio.move_on_after(_HOOK_TIMEOUT_S) as scope:
                await writer.submit(record_tool_process, pgid, owner, ticks, boot_id(), thread_id)
            if scope.cancelled_caught:
                _warn("recording tool process group %d timed out", pgid)
        except Exception:
            _warn("could not record tool process group %d (running=%s)", pgid, running, exc_info=True)

    async def _record_intent(intent: int) -> None:
        ticks = now_ticks()
        if ticks is None:
            return  # no procfs: nothing could be reaped by marker anyway
        with trio.move_on_after(_HOOK_TIMEOUT_S) as scope:
            await writer.submit(record_tool_process, intent, owner, ticks, boot_id(), thread_id)
        if scope.cancelled_caught:
            raise StoreBusy(f"recording a tool command took more than {_HOOK_TIMEOUT_S:g} s")

    return hook
