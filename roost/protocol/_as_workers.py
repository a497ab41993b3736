"""``roost app-server`` on every core: threads executed by worker processes (issue 19, "Every core").

One trio thread under the GIL cannot use a second core, so under load the app-server hands whole
threads to worker processes on the same store: each worker is the same ``roost app-server`` (same
arguments, ``ROOST_APPSERVER_WORKER=1``) serving one internal session over its stdin/stdout. A
worker owns the ThreadActors of the threads it was given (their turn loops, provider streams and
store writes, under the ordinary execution lease and its fencing token) and renders their
notifications to their final JSONL bytes itself. This process (the *front*) keeps the client:

* a request naming a thread a worker owns (``thread_id`` or ``session_id``) is forwarded to it
  unchanged and at once, in arrival order (so ``turn/interrupt`` reaches the worker's own
  immediate handler without waiting here); every other request is handled here as before;
* the worker's output is copied to the client's outbox as whole lines (:meth:`Outbox.deliver_chunk`:
  no per-event decoding; only lines starting ``{"id":`` are looked at, to learn the threads a
  forwarded ``thread/start`` or ``thread/fork`` created, to drop the answers to this process's own
  requests and to give server-initiated requests (``approval/request``) ids unique in the session);
  a client that reads slowly stops the copy (``wait_room``), so the worker's outbox coalesces;
* the client's ``initialize`` (and a workspace-scope ``config/model/update``) is repeated to each
  worker, so a worker's session has the client's capabilities and defaults.

When: with ``ROOST_APPSERVER_WORKERS`` workers at most (default :data:`DEFAULT_WORKERS`: none;
``auto``: the machine's cores minus one), started lazily, never before load needs them. The
session's load is its turns in flight: this process's running turns plus each worker's (a
forwarded ``turn/start`` until the thread's terminal line or an error answer passes through the
copy). A ``turn/start`` for an idle thread of this process moves the thread to the worker with the
fewest turns in flight once the load has been at least ``ROOST_APPSERVER_SPREAD_AT`` (default
:data:`DEFAULT_SPREAD_AT`) at every ``turn/start`` for :data:`SUSTAINED_S` seconds; the workers are
started halfway through that wait, so their start-up is over when threads begin to move. (Only
this process's own turns were counted before: each move lowered the count, one ``turn/start``
under the threshold restarted the wait, and a saturated session stayed split by accident.) With
``ROOST_APPSERVER_FRONT_SHARE=1`` a thread moves only while this process runs more turns than that
worker: it keeps a share. The thread leaves this process's registry first (the worker loads it
from the store). Only idle threads move, at their next ``turn/start``: under a steady load the
threads move over about one turn's duration after the wait.
``ROOST_APPSERVER_SPREAD_AT=0`` sends every non-ephemeral ``thread/start`` to a worker
(round-robin): the whole protocol then runs through workers (the end-to-end tests use it).

A worker that exits while the session lasts gives its threads back: this process reconciles the
store (:func:`roost.storage.reconcile`: the dead worker's leases are released, its running turns
end ``interrupted`` as after a crash), sends ``turn/completed`` for each such turn, answers the
requests the worker left unanswered with ``internal_error``, and serves those threads itself. At end
of input the workers' stdin is closed: each interrupts and persists its turns and exits, and its
last lines are copied before this session's outbox closes.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
from typing import Any, NoReturn

import attrs
import trio

from roost._json import dumps_line, loads
from roost._paths import usable_cores

__all__ = ["WorkerRouter", "worker_count", "spread_at", "is_worker", "PROCESS_NOTICES", "DEFAULT_SPREAD_AT"]

log = logging.getLogger("roost.appserver.workers")

#: Worker processes without ``ROOST_APPSERVER_WORKERS``: none. Measured on the shared 2-core
#: machine (issue 19; again in session 26, with the spread decision fixed and the CPU of the whole
#: process tree counted), one worker raised throughput and CPU under saturation but did not make the
#: harness's interrupt and first-delta latencies better than one process, so it stays opt-in.
DEFAULT_WORKERS = 0
#: Running turns of this process at which a ``turn/start`` moves an idle thread to a worker.
DEFAULT_SPREAD_AT = 16
#: Notifications about the process, not a thread: only the front sends them.
PROCESS_NOTICES = frozenset({"config/changed", "config/error", "mcp/status/updated"})
#: Id prefix of the front's own requests to a worker (their answers are dropped).
_INTERNAL = "roost-front-"
#: How a response or a server-initiated request line starts.
_ID = b'{"id":'
#: Bytes that may wait in the client's outbox before copying pauses: small, so that a backlog
#: waits in the worker's own outbox, which coalesces it and keeps its threads' lanes fair.
_ROOM = 64 << 10
#: Seconds this process must have run at least ``spread_at`` turns before a thread moves (a
#: short burst never pays a worker's start-up).
SUSTAINED_S = 2.0
#: Seconds a worker may take to finish after its stdin closes, before it is killed.
_STOP_S = 15.0
#: How a worker's terminal notification of a turn is rendered (``dumps_line`` of a notification).
_COMPLETED = b'"method":"turn/completed"'
_FAILED = b'"method":"turn/error"'
#: Requests whose answer names a thread the worker then owns (``result.thread.id``).
_CREATES = frozenset({"thread/start", "thread/fork", "run/start"})


def _count_env(name: str, default: int) -> int:
    """``$name`` as an integer >= 0, or ``default`` when unset, empty, or (with a warning naming
    the variable) not an integer >= 0."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        log.warning("%s=%r is not an integer >= 0; using the default %d", name, raw, default)
        return default
    return value


def worker_count() -> int:
    """``ROOST_APPSERVER_WORKERS``: worker processes at most (default :data:`DEFAULT_WORKERS`,
    none; ``auto``: the cores this process may use minus one). A value that is not an integer >= 0 warns
    and counts as the default; one above the cores minus one (at least 1) warns and is capped
    there (docs/operations.md)."""
    if os.environ.get("ROOST_APPSERVER_WORKERS", "").strip() == "auto":
        return usable_cores() - 1
    count = _count_env("ROOST_APPSERVER_WORKERS", DEFAULT_WORKERS)
    cap = max(1, usable_cores() - 1)
    if count > cap:
        log.warning("ROOST_APPSERVER_WORKERS=%d is more than the cores minus one; using %d", count, cap)
        return cap
    return count


def spread_at() -> int:
    """``ROOST_APPSERVER_SPREAD_AT`` (running turns, an integer >= 0) or :data:`DEFAULT_SPREAD_AT`;
    a bad value warns and counts as the default, like ``ROOST_APPSERVER_WORKERS``."""
    return _count_env("ROOST_APPSERVER_SPREAD_AT", DEFAULT_SPREAD_AT)


def is_worker() -> bool:
    """Whether this process is a worker of another app-server (``ROOST_APPSERVER_WORKER=1``)."""
    return os.environ.get("ROOST_APPSERVER_WORKER") == "1"


def worker_argv() -> list[str]:
    """A worker's command: this interpreter running ``roost`` with this process's arguments."""
    return [sys.executable, "-m", "roost", *sys.argv[1:]]


@attrs.define(eq=False)
class _Worker:
    index: int
    send: Any = None  # trio.MemorySendChannel[bytes] of lines for its stdin
    recv: Any = None
    started: bool = False
    alive: bool = True
    pid: int | None = None
    threads: set[str] = attrs.Factory(set)
    #: its threads with a turn in flight (a forwarded ``turn/start`` until the thread's terminal
    #: ``turn/completed``/``turn/error`` line or an error answer passes through :meth:`WorkerRouter._copy`)
    running: set[str] = attrs.Factory(set)
    #: forwarded request id -> method, until its answer is copied
    pending: dict[Any, tuple[str, str | None]] = attrs.Factory(dict)  # id -> (method, thread id)
    done: trio.Event = attrs.Factory(trio.Event)

    def reset(self) -> None:
        self.send, self.recv = trio.open_memory_channel[bytes](math.inf)
        self.started, self.alive, self.pid, self.done = False, True, None, trio.Event()
        self.running = set()


class WorkerRouter:
    """The front's side of the worker processes of one app-server session (see the module doc).

    Args:
        session: the :class:`~roost.protocol._appserver.AppServerSession` (its outbox, registry,
            nursery and reverse-request ids are used).
        count: worker processes at most (>= 1).
        spread: :func:`spread_at`.
        argv: a worker's command (default :func:`worker_argv`).
    """

    def __init__(self, session: Any, count: int, spread: int, argv: list[str] | None = None) -> None:
        self.session = session
        self.spread = spread
        self.argv = argv or worker_argv()
        self.workers = [_Worker(i) for i in range(count)]
        for worker in self.workers:
            worker.reset()
        #: thread id -> the worker that owns it
        self.owner: dict[str, _Worker] = {}
        self._handoffs: dict[str, list[bytes]] = {}  # thread -> lines held until it left here
        self._reverse: dict[str, tuple[_Worker, Any]] = {}  # id the client sees -> (worker, its id)
        self._setup: list[bytes] = []  # initialize and config/model/update (workspace scope), in order
        self._internal = 0
        self._next = 0
        self.closing = False
        #: whether this process keeps a share of the threads (else all move under load)
        self.keep_share = os.environ.get("ROOST_APPSERVER_FRONT_SHARE", "0") == "1"
        self._loaded_since: float | None = None  # since when every look saw >= spread turns

    # -- routing (synchronous: called by the reader for each request, in order) --------------

    def reply(self, frame: dict) -> bool:
        """Forward the client's answer to a worker's server-initiated request; False: not one."""
        target = self._reverse.pop(str(frame.get("id")), None)
        if target is None:
            return False
        worker, wid = target
        if worker.alive:
            self._send(worker, dumps_line(dict(frame, id=wid)))
        return True

    def route(self, rid: Any, name: str, params: Any, frame: dict) -> bool:
        """Forward request ``frame`` to the worker that is to handle it (True), or leave it here."""
        if name == "initialize" or (name == "config/model/update" and _thread_of(params) is None):
            line = dumps_line(dict(frame, id=self._internal_id()))
            self._setup.append(line)
            for worker in self.workers:
                if worker.started and worker.alive:
                    self._send(worker, line)
            return False
        thread_id = _thread_of(params)
        if thread_id is not None:
            owner = self.owner.get(thread_id)
            if owner is None and name == "turn/start":
                owner = self._spread_to(thread_id)
            if owner is None:
                return False
            self._forward(owner, rid, name, frame, thread_id)
            return True
        if name == "thread/start" and self.spread == 0 and not (isinstance(params, dict) and params.get("ephemeral")):
            worker = self.workers[self._next % len(self.workers)]
            self._next += 1
            self._forward(worker, rid, name, frame, None)
            return True
        return False

    def load(self) -> int:
        """Turns in flight in this session: this process's running turns and its workers'
        (:attr:`_Worker.running`)."""
        return self.session.runtime.registry.running_count() + sum(len(w.running) for w in self.workers)

    def _spread_to(self, thread_id: str) -> _Worker | None:
        """Move idle thread ``thread_id`` to a worker now, when the session is loaded enough (the
        module doc). Halfway through the wait for sustained load the workers not running yet
        are started, so that their start-up is over when threads begin to move."""
        if self.closing or self.spread == 0:
            return None
        registry = self.session.runtime.registry
        running = registry.running_count()
        if self.load() < self.spread:
            self._loaded_since = None
            return None
        alive = [w for w in self.workers if w.alive]
        now = trio.current_time()
        if self._loaded_since is None:
            self._loaded_since = now
        loaded_for = now - self._loaded_since
        if loaded_for >= SUSTAINED_S / 2:
            for idle in alive:  # their start-up overlaps the second half of the wait
                self._start(idle)
        if loaded_for < SUSTAINED_S:
            return None
        worker = min(alive, key=lambda w: len(w.running), default=None)
        if worker is None or (self.keep_share and running <= len(worker.running)):
            return None
        if not registry.can_hand_off(thread_id, self.session):
            return None
        self.owner[thread_id] = worker
        worker.threads.add(thread_id)
        self.session.subscribed.discard(thread_id)
        registry.remove_subscriber(thread_id, self.session)
        self._handoffs[thread_id] = []
        self.session.nursery.start_soon(self._finish_hand_off, thread_id, worker)
        return worker

    async def _finish_hand_off(self, thread_id: str, worker: _Worker) -> None:
        """Unload the thread here (the worker loads it from the store), then send what waited."""
        try:
            await self.session.runtime.registry.unload(thread_id)
        finally:
            for line in self._handoffs.pop(thread_id, ()):
                self._send(worker, line)

    def _forward(self, worker: _Worker, rid: Any, name: str, frame: dict, thread_id: str | None) -> None:
        worker.pending[rid] = (name, thread_id)
        if name == "turn/start" and thread_id is not None:
            worker.running.add(thread_id)
        line = dumps_line(frame)
        held = self._handoffs.get(thread_id) if thread_id is not None else None
        if held is not None:
            held.append(line)
        else:
            self._send(worker, line)

    def _internal_id(self) -> str:
        self._internal += 1
        return f"{_INTERNAL}{self._internal}"

    def _start(self, worker: _Worker) -> None:
        """Start ``worker``'s process now if it is not running (its setup lines go first)."""
        if not worker.started:
            worker.started = True
            self.session.nursery.start_soon(self._run, worker)

    def _send(self, worker: _Worker, line: bytes) -> None:
        self._start(worker)
        try:
            worker.send.send_nowait(line)
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            log.debug("worker %d: a line after it closed", worker.index)

    # -- one worker process --------------------------------------------------------------------

    async def _run(self, worker: _Worker) -> None:
        env = dict(os.environ, ROOST_APPSERVER_WORKER="1", ROOST_APPSERVER_WORKERS="0")
        try:
            process = await trio.lowlevel.open_process(
                self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
            )
        except OSError as exc:
            log.warning("could not start an app-server worker: %s", exc)
            await self._lost(worker)
            return
        worker.pid = process.pid
        log.info("app-server worker %d started (pid %d)", worker.index, process.pid)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._feed, worker, process.stdin)
                await self._copy(worker, process.stdout)
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                with trio.move_on_after(_STOP_S):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                if not self.closing:
                    log.warning("app-server worker %d exited (status %s)", worker.index, process.returncode)
                    await self._lost(worker)
                worker.done.set()

    async def _feed(self, worker: _Worker, stdin: Any) -> None:
        """Write the worker's lines (initialize first) to its stdin; closed channel: close stdin."""
        try:
            if self._setup:
                await stdin.send_all(b"".join(self._setup))
            async for line in worker.recv:
                batch = [line]
                while True:
                    try:
                        batch.append(worker.recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await stdin.send_all(b"".join(batch))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            log.debug("worker %d: stdin closed", worker.index)
        finally:
            with trio.CancelScope(shield=True):
                await stdin.aclose()

    async def _copy(self, worker: _Worker, stdout: Any) -> None:
        """Copy the worker's stdout to the client's outbox in whole lines until end of file."""
        outbox = self.session.outbox
        rest = b""
        while True:
            try:
                data = await stdout.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            if rest:
                data, rest = rest + data, b""
            cut = data.rfind(b"\n") + 1
            if cut < len(data):
                data, rest = data[:cut], data[cut:]
            if not data:
                continue
            if worker.running and (_COMPLETED in data or _FAILED in data):
                self._ended(worker, data)
            if _ID in data:
                data = self._scan(worker, data)
            if data:
                outbox.deliver_chunk(data)
                await outbox.wait_room(_ROOM)

    def _scan(self, worker: _Worker, chunk: bytes) -> bytes:
        """Look at the chunk's ``{"id":`` lines (module doc); the chunk as the client gets it."""
        parts: list[bytes] = []
        start = 0
        for begin in _id_lines(chunk):
            end = chunk.index(b"\n", begin) + 1
            line = chunk[begin:end]
            rid = _line_id(line)
            if isinstance(rid, str) and rid.startswith(_INTERNAL):
                replacement: bytes | None = b""
            elif isinstance(rid, str) and rid.startswith("roost-") and b'"method":' in line:
                message = loads(line)
                visible = self.session.next_reverse_id()
                self._reverse[visible] = (worker, rid)
                replacement = dumps_line(dict(message, id=visible))
            else:
                name, thread_id = worker.pending.pop(rid, (None, None))
                if name in _CREATES:
                    self._learn(worker, line)
                elif name == "turn/start" and b'"error":' in line and "error" in loads(line):
                    worker.running.discard(thread_id)  # refused: no turn in flight
                replacement = None
            if replacement is not None:
                parts.append(chunk[start:begin])
                parts.append(replacement)
                start = end
        if not parts:
            return chunk
        parts.append(chunk[start:])
        return b"".join(parts)

    def _ended(self, worker: _Worker, chunk: bytes) -> None:
        """The threads whose terminal ``turn/completed``/``turn/error`` line is in ``chunk`` have
        no turn in flight in ``worker`` any more (one decoded line per turn)."""
        for marker in (_COMPLETED, _FAILED):
            pos = chunk.find(marker)
            while pos >= 0:
                begin = chunk.rfind(b"\n", 0, pos) + 1
                end = chunk.index(b"\n", pos) + 1
                try:
                    thread_id = loads(chunk[begin:end])["params"]["thread_id"]
                except (KeyError, TypeError, ValueError):
                    thread_id = None
                worker.running.discard(thread_id)
                pos = chunk.find(marker, end)

    def _learn(self, worker: _Worker, line: bytes) -> None:
        """A forwarded request that creates a thread (``result.thread.id``) or a run
        (``result.run.id``) answered: the worker owns it."""
        try:
            result = loads(line)["result"]
            made = (result.get("thread") or result.get("run"))["id"]
        except (KeyError, TypeError, ValueError, AttributeError):
            return  # an error answer: nothing was created
        if isinstance(made, str):
            self.owner[made] = worker
            worker.threads.add(made)

    # -- a worker that exits; the session's end --------------------------------------------------

    async def _lost(self, worker: _Worker) -> None:
        """Take the threads of an exited worker back (module doc), then let it be started again."""
        threads = sorted(worker.threads)
        pending = dict(worker.pending)
        for thread_id in threads:
            if self.owner.get(thread_id) is worker:
                del self.owner[thread_id]
        for visible, (owner, _) in list(self._reverse.items()):
            if owner is worker:
                del self._reverse[visible]
        worker.send.close()
        worker.reset()
        session = self.session
        try:
            await trio.to_thread.run_sync(self._reconcile)
        except Exception:
            log.warning("could not reconcile after worker %d exited", worker.index, exc_info=True)
        for thread_id in threads:
            await self._settle_thread(thread_id)
        for rid, (name, _) in pending.items():
            session.send(
                {"id": rid, "error": {"code": "internal_error", "message": f"{name}: the worker process exited"}}
            )

    def _reconcile(self) -> None:
        from roost.storage import reconcile

        store = self.session.runtime.store
        with store.transaction() as conn:
            reconcile(conn, f"{self.session.runtime.services.owner}:front")

    async def _settle_thread(self, thread_id: str) -> None:
        """Load ``thread_id`` here; ``turn/completed`` for its turn the reconciliation ended."""
        from roost.protocol._as_common import thread_snapshot

        try:
            snapshot = await thread_snapshot(self.session, thread_id, 1)
        except Exception:
            log.debug("thread %s: not loaded after its worker exited", thread_id, exc_info=True)
            return
        turns = snapshot.get("turns") or []
        turn = turns[-1] if turns else None
        error = (turn or {}).get("error") or {}
        if turn and turn.get("status") == "interrupted" and error.get("reason") == "abandoned":
            self.session.notify("turn/completed", {"thread_id": thread_id, "turn": dict(turn, thread_id=thread_id)})

    async def aclose(self) -> None:
        """End of the session: close each worker's stdin and wait (bounded) for its last lines."""
        self.closing = True
        for worker in self.workers:
            if worker.started and worker.alive:  # a clean end (a bare end of input is a crash)
                self._send(worker, dumps_line({"id": self._internal_id(), "method": "shutdown"}))
            worker.send.close()
        with trio.move_on_after(_STOP_S + 1):
            for worker in self.workers:
                if worker.started:
                    await worker.done.wait()

    def views(self) -> list[dict]:
        """``[{index, pid, threads}]`` of the worker slots (for logs and tests)."""
        return [{"index": w.index, "pid": w.pid, "threads": len(w.threads)} for w in self.workers]


def _thread_of(params: Any) -> str | None:
    """The thread (``thread_id``, else ``session_id``) or run (``run_id``) a request names, as
    the ordering key does."""
    if isinstance(params, dict):
        for field in ("thread_id", "session_id", "run_id"):
            value = params.get(field)
            if isinstance(value, str):
                return value
    return None


def _id_lines(chunk: bytes) -> list[int]:
    """Offsets of the lines of ``chunk`` that start with ``{"id":``."""
    found = [0] if chunk.startswith(_ID) else []
    pos = chunk.find(b'\n{"id":')
    while pos >= 0:
        found.append(pos + 1)
        pos = chunk.find(b'\n{"id":', pos + 1)
    return found


_DECODER = json.JSONDecoder()


def _line_id(line: bytes) -> Any:
    """The ``id`` of a line starting ``{"id":`` (read from its first bytes; None if unreadable)."""
    head = line[6:262].decode("utf-8", "ignore")
    try:
        return _DECODER.raw_decode(head)[0]
    except ValueError:
        try:
            return loads(line).get("id")
        except (ValueError, AttributeError):
            return None


def install(session: Any) -> None:
    """Make ``session`` a worker's (in a worker process) or give it a :class:`WorkerRouter`
    (when :func:`worker_count` allows workers)."""
    if is_worker():
        session.worker = True
        return
    count = worker_count()
    if count > 0:
        session.router = WorkerRouter(session, count, spread_at())


def front_gone() -> NoReturn:
    """A worker's input ended without ``shutdown``: its front process died (``kill -9``...).
    End at once, as the front did, so that the store is left as after that crash (its turns are
    settled by the next process's reconciliation, as ``interrupted``/``abandoned``)."""
    log.warning("the front process went away; this worker ends with it")
    os.kill(os.getpid(), signal.SIGKILL)
    raise SystemExit(1)  # not reached
