"""Parent side of the cross-process storage tests: start ``storage_proc.py`` and read its lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import trio

HELPER = Path(__file__).with_name("storage_proc.py")
ROOT = Path(__file__).resolve().parents[2]


class Child:
    """One helper process with line-oriented stdout and a writable stdin."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    @classmethod
    async def start(cls, *args: str) -> Child:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        process = await trio.lowlevel.open_process(
            [sys.executable, str(HELPER), *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
        )
        return cls(process)

    async def readline(self) -> str:
        """Return the next line without its newline ("" at end of output)."""
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                rest, self._buffer = self._buffer, b""
                return rest.decode()
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    async def expect(self, prefix: str) -> str:
        """Read lines until one starts with ``prefix``; return it. Fails at end of output."""
        while True:
            line = await self.readline()
            if line.startswith(prefix):
                return line
            if line == "" and self.process.poll() is not None:
                raise AssertionError(f"child ended (rc={self.process.returncode}) before {prefix!r}")

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    async def rest(self) -> list[str]:
        """Read every remaining line until the child closes its stdout."""
        lines = []
        while True:
            line = await self.readline()
            if line == "":
                return lines
            lines.append(line)

    async def aclose(self) -> None:
        """Kill (if still running) and reap the child."""
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGCONT)
                self.process.kill()
            except ProcessLookupError:
                pass
        with trio.CancelScope(shield=True):
            await self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    await stream.aclose()
