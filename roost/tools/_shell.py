"""The ``shell`` tool: ``/bin/sh -c COMMAND`` in its own process group, output streamed and capped.

Stopping (timeout or cancellation) follows DESIGN.md section 4: the whole process group gets
SIGTERM, then SIGKILL once the grace period (``ToolContext.kill_grace_s``, default 2 s) has passed
with any member still running. On cancellation that clean-up runs shielded and bounded, then
``trio.Cancelled`` propagates.

Because the group is a session of its own, it does not die with Roost. Two measures keep a
killed Roost (SIGKILL) from leaving commands running forever:

* Linux: ``sh`` gets ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` before it execs, so it dies with Roost.
  The kernel sends that signal when the *thread* that forked the child exits, not the process.
  ``trio.lowlevel.open_process`` forks in a worker thread of trio's cache, and idle workers exit
  after 10 s, which would kill the command mid-run; so :func:`spawn_shell` forks on the trio
  thread itself (``subprocess.Popen`` there, blocking it for the fork and exec: well under a
  millisecond to a few) and wraps the result as a ``trio.Process``. The signal does not reach
  ``sh``'s children (the setting is cleared on fork) and is cleared on exec of set-uid binaries.
* Durable reaping: before the fork, ``ToolContext.on_process`` is told of the *intent*
  (``pgid`` = minus a random marker that the command's environment carries as
  ``ROOST_TOOL_MARK``, inherited by everything it starts) and must have recorded it; then of the
  group itself. Start-up reconciliation kills a dead predecessor's groups, and every process
  carrying the marker of a recorded intent (:func:`roost.storage.reap_tool_processes`), so a kill
  landing between the fork and the group's row leaves nothing unknown (issue 18, finding 2).

Elsewhere (or if libc's ``prctl`` or trio's ``Process._create`` is missing) the command starts
through ``trio.lowlevel.open_process`` without the death signal.
"""

from __future__ import annotations

import codecs
import ctypes
import functools
import logging
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import trio

from roost import _faults as faults
from roost.errors import ToolError
from roost.tools._model import Tool, ToolContext, ToolResult
from roost.tools._output import OutputBuffer

__all__ = ["SHELL", "MARK_ENV", "spawn_shell", "stop_process_group"]

log = logging.getLogger("roost.tools")

#: Bytes asked of each read of the command's output pipe.
_CHUNK_BYTES = 64 * 1024
#: Seconds to keep reading after ``sh`` exits, while a background job still holds the pipe open.
_DRAIN_AFTER_EXIT_S = 0.5
#: Seconds between checks that a signalled process group has emptied.
_POLL_S = 0.02
#: Most seconds to wait for SIGKILLed members to disappear.
_KILL_SETTLE_S = 2.0
#: Extra seconds the shielded clean-up allows beyond the grace period (SIGKILL and reaping).
_REAP_S = 5.0
#: Most seconds the shielded clean-up gives ``ToolContext.on_process`` to hear of the end.
_NOTIFY_S = 5.0
#: Environment variable carrying a command's marker to every process it starts (reaping by marker).
MARK_ENV = "ROOST_TOOL_MARK"
#: ``prctl`` option (linux/prctl.h): the signal a process gets when its parent thread exits.
_PR_SET_PDEATHSIG = 1

_DEFAULT_TIMEOUT_S = 120.0
_MAX_TIMEOUT_S = 3600.0

_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "command": {
            "type": "string",
            "description": "The command line, run by /bin/sh -c in the working directory.",
        },
        "timeout_s": {
            "type": "number",
            "description": "Seconds before the command and everything it started are killed.",
            "minimum": 0.1,
            "maximum": _MAX_TIMEOUT_S,
            "default": _DEFAULT_TIMEOUT_S,
        },
        "background": {
            "type": "boolean",
            "description": "Start the command in the background and return at once; when it exits "
            "you get its exit status and output in a new message.",
            "default": False,
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}


def _killpg(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; return False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        # A member changed credentials (setuid); the others got the signal.
        return True
    return True


def _group_running(pgid: int) -> bool:
    """True while some member of process group ``pgid`` is running (zombies do not count)."""
    if not _killpg(pgid, 0):
        return False
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True  # no procfs: a zombie member looks alive; the caller then waits the grace out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Format: pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


@functools.lru_cache(maxsize=1)
def _libc_prctl() -> Callable[..., int] | None:
    """Return libc's ``prctl`` (ctypes), or None off Linux or when it cannot be found."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """Return a ``preexec_fn`` giving the child SIGKILL when its parent thread exits, or None.

    It runs in the forked child before exec (only the forking thread exists there), calling an
    already-resolved ctypes function: no import, no lock. If the parent died between the fork and
    the ``prctl`` (the child was re-parented), the child kills itself.
    """
    prctl = _libc_prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    sigkill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigkill, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigkill)

    return preexec


async def spawn_shell(command: str, *, cwd: str, env: dict[str, str]) -> trio.Process:
    """Start ``/bin/sh -c command`` leading a new session, stdout+stderr on one pipe, stdin null.

    On Linux the child gets ``PR_SET_PDEATHSIG`` = SIGKILL and is forked on the calling (trio)
    thread, so it dies when that thread, i.e. Roost, does (see the module docstring); the call
    blocks the trio thread for the fork and exec. Elsewhere it is
    ``trio.lowlevel.open_process`` (forks in a worker thread), without the death signal.

    Args:
        command: the command line for ``sh -c``.
        cwd: the working directory.
        env: the complete environment.

    Returns:
        The ``trio.Process`` (``stdout`` is the combined output stream; ``pid`` is the pgid).

    Raises:
        OSError: the process could not be started.
    """
    argv = ["/bin/sh", "-c", command]
    preexec = _pdeathsig_preexec()
    create = getattr(trio.Process, "_create", None)
    if preexec is not None and create is None:
        # Pinned in pyproject (trio < 0.36) and guarded by tests/test_tool_reaper.py; never silent.
        log.error(
            "trio.Process._create is gone (trio %s): shell commands start WITHOUT the death "
            "signal and may outlive a killed Roost",
            trio.__version__,
        )
    if preexec is None or create is None:
        return await trio.lowlevel.open_process(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    read_fd, write_fd = os.pipe()
    try:
        try:
            popen = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                start_new_session=True,
                preexec_fn=preexec,
            )
        finally:
            os.close(write_fd)
        stdout = trio.lowlevel.FdStream(read_fd)
    except BaseException:
        os.close(read_fd)
        raise
    return create(popen, None, stdout, None)


async def _announce_intent(ctx: ToolContext, intent: int) -> None:
    """Tell ``ctx.on_process`` of the command about to start (``intent`` < 0 is minus its marker).

    Unlike the other notifications this one must succeed: a command the store cannot be told of
    is not started.

    Raises:
        ToolError: the hook failed (e.g. the store is unwritable); nothing was started.
    """
    if ctx.on_process is None:
        return
    try:
        await ctx.on_process(intent, True)
    except Exception as exc:
        log.warning("could not record a shell command before starting it", exc_info=True)
        raise ToolError(f"the command was not started: it could not be recorded first ({exc})") from exc


async def _notify(ctx: ToolContext, pgid: int, running: bool) -> None:
    """Tell ``ctx.on_process`` (if set) about group ``pgid``; its errors are logged, not raised."""
    if ctx.on_process is None:
        return
    try:
        await ctx.on_process(pgid, running)
    except Exception:
        log.warning("on_process(%d, %s) failed", pgid, running, exc_info=True)


async def stop_process_group(process: trio.Process, *, grace_s: float) -> None:
    """Stop ``process`` and every process in its group: SIGTERM, then SIGKILL after ``grace_s``.

    ``process`` must lead its own process group (started with ``start_new_session=True``).
    Returns once the leader is reaped and no member is left running, or right after SIGKILL.

    Args:
        process: the group leader.
        grace_s: seconds the group has to exit after SIGTERM before it gets SIGKILL.

    Cancellation:
        A checkpoint; callers that must finish clean-up call it shielded, bounded by
        ``move_on_after``. Cancelled part-way, the group may still be running.
    """
    pgid = process.pid
    if not _killpg(pgid, signal.SIGTERM):
        await process.wait()
        return
    with trio.move_on_after(grace_s):
        await process.wait()
        while _group_running(pgid):
            await trio.sleep(_POLL_S)
        return
    _killpg(pgid, signal.SIGKILL)
    await process.wait()
    # SIGKILL cannot be caught, but delivery is asynchronous: wait until the members are gone.
    with trio.move_on_after(_KILL_SETTLE_S):
        while _group_running(pgid):
            await trio.sleep(_POLL_S)


async def _read_output(
    stream: trio.abc.ReceiveStream, out: OutputBuffer, ctx: ToolContext, scope: trio.CancelScope
) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    with scope:
        while True:
            chunk = await stream.receive_some(_CHUNK_BYTES)
            if not chunk:
                break
            out.add(chunk)
            ctx.emit(decoder.decode(chunk))
    ctx.emit(decoder.decode(b"", final=True))


async def _pump(process: trio.Process, out: OutputBuffer, ctx: ToolContext) -> None:
    """Stream output until ``sh`` exits and its pipe reaches EOF (or the drain window closes)."""
    assert process.stdout is not None
    reader_scope = trio.CancelScope()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_output, process.stdout, out, ctx, reader_scope)
            await process.wait()
            # A background job (``cmd &``) may keep the pipe open long after sh exited.
            reader_scope.deadline = trio.current_time() + _DRAIN_AFTER_EXIT_S
    except BaseExceptionGroup as group:
        # Callers see a bare Cancelled (or the single error), never a group of them.
        raise _single(group) from None


def _single(group: BaseExceptionGroup) -> BaseException:
    """Return the one exception to raise for ``group``: a Cancelled when it holds only those."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    errors = [e for e in leaves if not isinstance(e, trio.Cancelled)]
    if not errors:
        return leaves[0]
    if len(leaves) == 1:
        return errors[0]
    return group  # several errors, or errors mixed with Cancelled: keep them all


async def _run_shell(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    command: str = args["command"]
    timeout_s = float(args["timeout_s"])
    if not ctx.cwd.is_dir():
        raise ToolError(f"working directory {str(ctx.cwd)!r} does not exist")
    if args.get("background"):
        return await _start_background(command, ctx)
    # Nothing runs that the store does not know about first (issue 18, finding 2): the intent,
    # keyed by a marker every process of the command inherits, commits before the fork.
    mark = secrets.randbits(62) + 1
    await _announce_intent(ctx, -mark)
    env = {**os.environ, "PAGER": "cat", "GIT_PAGER": "cat", MARK_ENV: str(mark)}
    try:
        process = await spawn_shell(command, cwd=str(ctx.cwd), env=env)
    except OSError as exc:
        with trio.CancelScope(shield=True), trio.move_on_after(_NOTIFY_S):
            await _notify(ctx, -mark, False)
        raise ToolError(f"could not start /bin/sh: {exc}") from exc
    faults.point("tool.spawned")
    out = OutputBuffer(ctx.output_cap_bytes)
    started = trio.current_time()
    stopped = timed_out = False
    try:
        await _notify(ctx, process.pid, True)
        with trio.move_on_after(timeout_s) as deadline:
            await _pump(process, out, ctx)
        timed_out = deadline.cancelled_caught
        if timed_out:
            await stop_process_group(process, grace_s=ctx.kill_grace_s)
        stopped = True
    finally:
        with trio.CancelScope(shield=True):
            if not stopped:
                with trio.move_on_after(ctx.kill_grace_s + _REAP_S):
                    await stop_process_group(process, grace_s=ctx.kill_grace_s)
            assert process.stdout is not None
            await process.stdout.aclose()
            # A group that a stop could not empty stays known (a restart may still reap it).
            if not ((timed_out or not stopped) and _group_running(process.pid)):
                with trio.move_on_after(_NOTIFY_S):
                    await _notify(ctx, process.pid, False)
                    await _notify(ctx, -mark, False)
    exit_code = process.returncode
    text = out.text()
    if timed_out:
        text += f"\n[timed out after {timeout_s:g} s; the command's process group was killed]"
    elif exit_code != 0:
        text += f"\n[exit code {exit_code}]"
    return ToolResult(
        output=text,
        is_error=timed_out or exit_code != 0,
        metadata={
            "exit_code": exit_code,
            "timed_out": timed_out,
            "truncated": out.truncated,
            "output_bytes": out.total_bytes,
            "duration_s": round(trio.current_time() - started, 3),
        },
    )


async def _start_background(command: str, ctx: ToolContext) -> ToolResult:
    """``background: true``: hand the command to ``ctx.start_background`` and return at once."""
    if ctx.start_background is None:
        raise ToolError("background processes are not available here; run the command without background")
    try:
        process = await ctx.start_background(command, ctx.cwd)
    except OSError as exc:
        raise ToolError(f"could not start /bin/sh: {exc}") from exc
    return ToolResult(
        output=f"started background process {process['id']} (pid {process['pid']}); its exit status and "
        "output will be sent to you when it exits",
        is_error=False,
        metadata={"process_id": process["id"], "background": True},
    )


async def _shell_approval(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"command": args["command"]}


#: The ``shell`` tool.
SHELL = Tool(
    name="shell",
    description=(
        "Run a shell command with /bin/sh -c in the working directory. Returns the combined "
        "stdout and stderr (long output keeps its beginning and end) and the exit code. The "
        "command and every process it starts are killed when timeout_s elapses."
    ),
    parameters=_PARAMETERS,
    mutating=True,
    approval_kind="shell_command",
    run=_run_shell,
    approval_fields=_shell_approval,
)
