"""The repl's ``!command`` shell escape (wire-protocol.md, "Turn events (stdio)": ``shell_start``,
``shell_output``, ``shell_end``).

The command is the user's own action, so no approval is asked; it runs as the ``shell`` tool runs
its commands (:func:`roost.tools._shell.spawn_shell`: its own process group, stdin null, stdout
and stderr on one pipe) and is stopped the same way (:func:`roost.tools.stop_process_group`).
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path
from typing import Any

import trio

from roost.protocol._repl_events import TOOL_OUTPUT_CHARS

__all__ = ["ShellEscape", "SHELL_OUTPUT_CHARS"]

#: ``shell_output`` of one ``!command`` is capped at this many characters in total (like tool_result).
SHELL_OUTPUT_CHARS = TOOL_OUTPUT_CHARS
#: Seconds a stopped ``!command``'s process group has between SIGTERM and SIGKILL.
_SHELL_KILL_GRACE = 2.0
#: Extra seconds the shielded stop of a ``!command`` allows beyond the grace (SIGKILL, reaping).
_SHELL_REAP = 5.0
#: Seconds to keep reading after ``sh`` exits, while a background job still holds the pipe open.
_SHELL_DRAIN = 0.5
#: Bytes asked of each read of a ``!command``'s output pipe.
_SHELL_CHUNK = 64 * 1024


class ShellEscape:
    """One ``!command``: ``/bin/sh -c command`` in the chat's directory, streamed as stdio events.

    The command leads a process group of its own (:func:`roost.tools._shell.spawn_shell`, as the
    ``shell`` tool starts it: stdin null, stdout and stderr on one pipe); :meth:`stop` ends the
    whole group with :func:`roost.tools.stop_process_group` (SIGTERM, SIGKILL after 2 s).

    Events, through ``emit``: ``shell_start {command}`` once the command started; ``shell_output
    {text}`` chunks as output arrives (at most :data:`SHELL_OUTPUT_CHARS` characters in total, then
    one truncation notice); ``shell_end {exitCode, truncated, interrupted}`` last. ``exitCode`` is
    the shell's status (negative: the signal that ended it; None if it could not be reaped). A
    command that cannot start gives one ``error`` event instead of all of these.

    Args:
        command: the command line (without the ``!``).
        cwd: the working directory.
        emit: queues one event dict (never blocks).

    Attributes:
        interrupted: True once :meth:`stop` was called.
        done: set when :meth:`run` returns.
    """

    def __init__(self, command: str, *, cwd: Path, emit: Any) -> None:
        self.command = command
        self.cwd = cwd
        self.emit = emit
        self.interrupted = False
        self.truncated = False
        self.done = trio.Event()
        self._shown = 0
        self._scope = trio.CancelScope()

    def stop(self) -> None:
        """Stop the command and its process group; :meth:`run` then sends ``shell_end``."""
        self.interrupted = True
        self._scope.cancel()

    async def run(self) -> bool:
        """Run the command until it ends or is stopped.

        Returns:
            True when it ran (``shell_end`` was sent), False when it could not start (``error``).

        Cancellation: cancelled from outside, the process group is stopped first (shielded,
        bounded), then ``trio.Cancelled`` propagates without ``shell_end``.
        """
        from roost.tools import spawn_shell

        try:
            try:
                if not self.cwd.is_dir():
                    raise OSError(f"the working directory {str(self.cwd)!r} does not exist")
                env = {**os.environ, "PAGER": "cat", "GIT_PAGER": "cat"}
                process = await spawn_shell(self.command, cwd=str(self.cwd), env=env)
            except (OSError, ValueError) as exc:  # ValueError: a NUL in the command line
                self.emit({"type": "error", "text": f"could not run !{self.command}: {exc}"})
                return False
            self.emit({"type": "shell_start", "command": self.command})
            try:
                with self._scope:
                    await self._pump(process)
            finally:
                with trio.CancelScope(shield=True):
                    await self._reap(process)
            self.emit(
                {
                    "type": "shell_end",
                    "exitCode": process.returncode,
                    "truncated": self.truncated,
                    "interrupted": self.interrupted,
                }
            )
            return True
        finally:
            self.done.set()

    async def _pump(self, process: trio.Process) -> None:
        """Stream output until ``sh`` exits and its pipe reaches EOF (or the drain window closes)."""
        reader = trio.CancelScope()
        assert process.stdout is not None  # started with stdout=PIPE
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read, process.stdout, reader)
            await process.wait()
            # A background job (``cmd &``) may keep the pipe open long after sh exited.
            reader.deadline = trio.current_time() + _SHELL_DRAIN

    async def _read(self, stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with scope:
            while chunk := await stream.receive_some(_SHELL_CHUNK):
                self._output(decoder.decode(chunk))
        self._output(decoder.decode(b"", final=True))

    def _output(self, text: str) -> None:
        """Send ``text`` as ``shell_output`` within the cap; past it, one truncation notice."""
        if not text or self.truncated:
            return
        room = SHELL_OUTPUT_CHARS - self._shown
        if room > 0:
            piece = text[:room]
            self._shown += len(piece)
            self.emit({"type": "shell_output", "text": piece})
        if len(text) > room:
            self.truncated = True
            self.emit(
                {
                    "type": "shell_output",
                    "text": f"\n[output truncated: only the first {SHELL_OUTPUT_CHARS:,} characters are shown]\n",
                }
            )

    async def _reap(self, process: trio.Process) -> None:
        """Stop the process group when stopped or still running (bounded); close the pipe."""
        from roost.tools import stop_process_group

        if self.interrupted or process.returncode is None:
            with trio.move_on_after(_SHELL_KILL_GRACE + _SHELL_REAP):
                await stop_process_group(process, grace_s=_SHELL_KILL_GRACE)
        assert process.stdout is not None
        await process.stdout.aclose()
