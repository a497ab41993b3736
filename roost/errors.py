"""The one exception tree of Roost.

Every error Roost raises derives from :class:`RoostError`. Foreign errors (sqlite3, httpx, OS) are
translated at the boundary of the room that meets them and raised ``from`` the original.
``trio.Cancelled`` is never wrapped or subclassed.

::

    RoostError
    ├── ActorError                      actor kernel (roost.actors)
    │   ├── MailboxFull                 tell() on a full mailbox; the sender is never blocked
    │   ├── MailboxClosed               tell()/ask() on an actor that has stopped
    │   ├── AskTimeout                  ask() got no reply before its deadline
    │   ├── ActorCrashed                the actor answering an ask() died before replying
    │   └── NodeUnreachable             another node on the bus did not answer (roost.actors.NodeBus)
    ├── SupervisorError                 supervision (roost.supervisor)
    │   ├── RestartIntensityExceeded    too many restarts in the period; escalates to the parent
    │   └── ChildNotFound               no child with that id
    ├── StoreError                      persistence (roost.storage)
    │   ├── StoreBusy                   the database stayed locked past busy_timeout
    │   ├── StoreClosed                 the writer has stopped
    │   ├── StoreFull                   the writer's bounded queue is full (submit_nowait)
    │   ├── Conflict                    a uniqueness or foreign-key constraint refused the write
    │   ├── MigrationError              the schema could not be brought up to date
    │   ├── DatabaseSettingError        the database setting (``ROOST_DATABASE_URL``) does not work
    │   │   ├── DatabaseUrlInvalid      the URL is not a usable database URL
    │   │   ├── DatabaseUnreachable     no server answers at the URL (or it refused the login)
    │   │   ├── DatabasePermissionDenied  the role lacks a privilege Roost needs
    │   │   └── SchemaTooNew            the database has migrations this Roost does not know
    │   ├── LeaseError                  execution leases (roost.storage.leases)
    │   │   ├── LeaseHeld               another live owner holds the lease
    │   │   └── StaleLease              the fencing token was superseded; the write changed nothing
    │   ├── StoreDiskFull               no space left to write the database (disk or size limit)
    │   ├── StoreReadOnly               the database (file, directory or mount) is not writable
    │   ├── StoreCorrupt                not a database, or it fails the integrity check
    │   └── NotFound                    no row with that key (``kind``: which table)
    ├── EngineError                     model engines (roost.engines), see roost.engines for details
    │   └── EngineFailure               a model call failed: category, retryable, recovery facts
    ├── ToolError                       built-in tools (roost.tools)
    │   ├── InvalidToolArguments        the model's arguments do not match the tool's schema
    │   ├── McpUnavailable              an MCP server is not connected (failed to start, died, hung)
    │   └── McpCallTimeout              an MCP tool call got no answer within its timeout
    ├── ConfigError                     settings, config files, provider selection
    ├── ProtocolError                   a front door's error reply; one leaf class per wire code (``.code``)
    │   ├── RequestError                the request cannot be served as sent
    │   │   ├── ParseError              parse_error: not JSON, or a line too long
    │   │   ├── InvalidRequest          invalid_request: not a request envelope
    │   │   ├── MethodNotFound          method_not_found
    │   │   └── InvalidParams           invalid_params: missing, unknown or mistyped parameters
    │   ├── ResourceNotFound            the request names something that does not exist
    │   │   ├── ThreadNotFound          thread_not_found
    │   │   ├── TurnNotFound            turn_not_found
    │   │   └── RunNotFound             run_not_found
    │   ├── StateConflict               well formed, but the current state refuses it
    │   │   ├── ThreadBusy              thread_busy: executing here or in another process
    │   │   ├── RunNotAttached          run_not_attached: the run is owned by another process
    │   │   ├── StaleTurn               stale_turn: the expected turn is not the current one
    │   │   └── ReadOnly                read_only: this client may not mutate
    │   └── ServerError                 the server cannot serve it now, or at all
    │       ├── ServerOverloaded        server_overloaded: a bounded queue is full; retry later
    │       ├── Unsupported             unsupported: Roost does not have this feature
    │       └── InternalError           internal_error: an unexpected failure
    └── UsageError                      misuse of a Roost API by the calling code (a bug, not input)
        └── LifecycleError              an operation that the object's lifecycle state forbids
"""

from __future__ import annotations

__all__ = [
    "RoostError",
    "ActorError",
    "MailboxFull",
    "MailboxClosed",
    "AskTimeout",
    "NodeUnreachable",
    "ActorCrashed",
    "SupervisorError",
    "RestartIntensityExceeded",
    "ChildNotFound",
    "StoreError",
    "StoreBusy",
    "StoreClosed",
    "StoreFull",
    "Conflict",
    "MigrationError",
    "DatabaseSettingError",
    "DatabaseUrlInvalid",
    "DatabaseUnreachable",
    "DatabasePermissionDenied",
    "SchemaTooNew",
    "LeaseError",
    "LeaseHeld",
    "StaleLease",
    "NotFound",
    "StoreDiskFull",
    "StoreReadOnly",
    "StoreCorrupt",
    "EngineError",
    "EngineFailure",
    "ToolError",
    "InvalidToolArguments",
    "McpUnavailable",
    "McpCallTimeout",
    "ConfigError",
    "ProtocolError",
    "RequestError",
    "ResourceNotFound",
    "StateConflict",
    "ServerError",
    "ParseError",
    "InvalidRequest",
    "MethodNotFound",
    "InvalidParams",
    "ThreadNotFound",
    "TurnNotFound",
    "RunNotFound",
    "ThreadBusy",
    "RunNotAttached",
    "StaleTurn",
    "ReadOnly",
    "ServerOverloaded",
    "Unsupported",
    "InternalError",
    "UsageError",
    "LifecycleError",
    "PROTOCOL_ERRORS",
]


class RoostError(Exception):
    """Root of every error Roost raises."""


# -- actors -------------------------------------------------------------------------------------


class ActorError(RoostError):
    """An actor-kernel failure."""


class MailboxFull(ActorError):
    """``tell`` found the recipient's bounded mailbox full; the message was not delivered."""


class MailboxClosed(ActorError):
    """The recipient has stopped (or is stopping) and accepts no more messages."""


class AskTimeout(ActorError):
    """``ask`` received no reply within its timeout."""


class ActorCrashed(ActorError):
    """The actor died before it replied to an ``ask``."""


class NodeUnreachable(ActorError):
    """Another node on the bus did not answer a request (:meth:`roost.actors.NodeBus.request`).

    Attributes:
        delivered: False when the request was withdrawn unclaimed (the node will never act on
            it); True when the node claimed it and then stopped answering (it may have acted).
    """

    def __init__(self, message: str, *, delivered: bool = False) -> None:
        super().__init__(message)
        self.delivered = delivered


# -- supervision --------------------------------------------------------------------------------


class SupervisorError(RoostError):
    """A supervision failure."""


class RestartIntensityExceeded(SupervisorError):
    """More restarts than the supervisor's intensity allows within its period.

    The supervisor stops all its children and raises this to its own parent (escalation).
    """


class ChildNotFound(SupervisorError):
    """The supervisor has no child with the given id."""


# -- storage ------------------------------------------------------------------------------------


class StoreError(RoostError):
    """A persistence failure."""


class StoreBusy(StoreError):
    """The database stayed locked by another connection past ``busy_timeout``."""


class StoreClosed(StoreError):
    """The store (or its writer) is closed."""


class StoreFull(StoreError):
    """The writer's bounded queue is full; the write was not queued (retry later)."""


class Conflict(StoreError):
    """A uniqueness or foreign-key constraint refused the write; nothing of it was stored."""


class MigrationError(StoreError):
    """The schema could not be migrated to the current version."""


class DatabaseSettingError(StoreError):
    """The configured database (``ROOST_DATABASE_URL`` or ``--database-url``) cannot be used.

    ``setting`` names the setting to fix (the message names it too).
    """

    def __init__(self, message: str, *, setting: str = "ROOST_DATABASE_URL") -> None:
        super().__init__(message)
        self.setting = setting


class DatabaseUrlInvalid(DatabaseSettingError):
    """The database URL is malformed or of an unsupported scheme."""


class DatabaseUnreachable(DatabaseSettingError):
    """No database server answers at the URL, or it refused the connection or the login."""


class DatabasePermissionDenied(DatabaseSettingError):
    """The database role lacks a privilege Roost needs (connecting, creating its tables, writing)."""


class SchemaTooNew(DatabaseSettingError):
    """The database holds migrations this version of Roost does not know (a newer Roost made it)."""


class LeaseError(StoreError):
    """An execution-lease failure."""


class LeaseHeld(LeaseError):
    """Another live owner holds the lease; its ``owner`` and ``expires_at`` are attached."""

    def __init__(self, message: str, *, owner: str | None = None, expires_at: float | None = None):
        super().__init__(message)
        self.owner = owner
        self.expires_at = expires_at


class StaleLease(LeaseError):
    """The fencing token was superseded by a newer acquisition; the guarded write changed nothing."""


class NotFound(StoreError):
    """No row with the given key; ``kind`` names what is missing (the table, e.g. ``"threads"``)."""

    def __init__(self, message: str = "", *, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class StoreDiskFull(StoreError):
    """The database could not grow: the disk (or a file-size limit) is full (SQLITE_FULL,
    SQLITE_IOERR_WRITE). Nothing committed is lost; reads still work; free space and retry."""


class StoreReadOnly(StoreError):
    """The database file, its directory or its mount is not writable (SQLITE_READONLY, or
    SQLITE_CANTOPEN on a path that is not writable), or PostgreSQL refused a write in a read-only
    transaction (SQLSTATE 25006, e.g. a hot standby). Its contents are fine; reads still work."""


class StoreCorrupt(StoreError):
    """The file is not a SQLite database, or fails SQLite's integrity check (SQLITE_CORRUPT,
    SQLITE_NOTADB)."""


# -- other rooms --------------------------------------------------------------------------------


class EngineError(RoostError):
    """A model-engine failure (see :mod:`roost.engines` for the categories)."""


def new_operation_id() -> str:
    """A fresh inference operation id (``op_`` + 24 hex digits) for one logical model stream."""
    import secrets

    return "op_" + secrets.token_hex(12)


class EngineFailure(EngineError):
    """A model call failed; raised by an engine stream in place of its remaining events.

    Attributes:
        category: one of ``network``, ``auth``, ``rate_limit``, ``provider``, ``invalid_request``,
            ``context_length``, ``cancelled``.
        retryable: whether the same request may succeed if sent again later.
        provider_code: the provider's own error code or type (``"rate_limit_exceeded"``,
            ``"overloaded_error"``), when it gave one.
        http_status: the HTTP status of the failed response, when there was one.
        partial_text: assistant text streamed before the failure (kept, never discarded).
        attempt_count, retry_count, submission_count, max_attempts, stop_reason,
        failure_category: the recovery facts of app-server-protocol.md ("Turns and execution
            runs"): attempts started, retries started, physical provider requests, the attempt
            limit, why recovery stopped (``non_retryable``, ``retry_limit``, ``replay_unsafe``,
            ``recovery_unavailable``) and the category that decided it.
        operation_id: identifies the failed logical stream in inference diagnostics (the same
            id across the stream's retries; HTTP engines log it with each attempt); ``op_``
            followed by 24 hex digits.
    """

    CATEGORIES = frozenset(
        {"network", "auth", "rate_limit", "provider", "invalid_request", "context_length", "cancelled"}
    )

    def __init__(
        self,
        message: str,
        *,
        category: str,
        retryable: bool = False,
        provider_code: str | None = None,
        http_status: int | None = None,
        partial_text: str = "",
        attempt_count: int = 1,
        retry_count: int = 0,
        submission_count: int = 1,
        max_attempts: int = 1,
        stop_reason: str | None = None,
        operation_id: str | None = None,
    ):
        if category not in self.CATEGORIES:
            raise ValueError(f"unknown engine failure category {category!r}")
        super().__init__(message)
        self.message = message
        self.category = category
        self.retryable = retryable
        self.provider_code = provider_code
        self.http_status = http_status
        self.partial_text = partial_text
        self.attempt_count = attempt_count
        self.retry_count = retry_count
        self.submission_count = submission_count
        self.max_attempts = max_attempts
        self.stop_reason = stop_reason or ("retry_limit" if retryable else "non_retryable")
        self.failure_category = category
        self.operation_id = operation_id or new_operation_id()

    def recovery(self) -> dict:
        """Return the recovery facts as a dict (the ``turn.error.recovery`` object)."""
        return {
            "attempt_count": self.attempt_count,
            "retry_count": self.retry_count,
            "submission_count": self.submission_count,
            "max_attempts": self.max_attempts,
            "stop_reason": self.stop_reason,
            "failure_category": self.failure_category,
            "operation_id": self.operation_id,
        }

    def to_dict(self) -> dict:
        """Return every field as JSON-ready primitives (for items and wire errors)."""
        return {
            "message": self.message,
            "category": self.category,
            "retryable": self.retryable,
            "provider_code": self.provider_code,
            "http_status": self.http_status,
            "partial_text": self.partial_text,
            "recovery": self.recovery(),
        }


class ToolError(RoostError):
    """A built-in tool failed in a way its result reports to the model."""


class InvalidToolArguments(ToolError):
    """The arguments of a tool call do not match the tool's parameter schema.

    ``field`` names the offending argument (``None`` when the arguments are not an object).
    """

    def __init__(self, message: str, *, field: str | None = None):
        super().__init__(message)
        self.field = field


class McpUnavailable(ToolError):
    """An MCP server's tool was called while the server is not connected (roost.plugins): it failed
    to start, died or hung; it is being reconnected with a bounded backoff."""


class McpCallTimeout(ToolError):
    """An MCP tool call got no answer within its timeout (``TimeoutSeconds`` / ``timeout``)."""


class ConfigError(RoostError):
    """Settings or a configuration file are missing or invalid."""


# -- protocol errors: one class per wire code ---------------------------------------------------


class ProtocolError(RoostError):
    """An error a front door reports to its client as ``{"code": ..., "message": ...}``.

    Raise a leaf class (its ``code`` is the wire string of the spec's error codes); the four
    groups below exist for ``except`` clauses and are never sent themselves.
    """

    code: str = "internal_error"

    def __init__(self, message: str = "", *, data: dict | None = None):
        super().__init__(message or self.code)
        self.message = message or self.code
        self.data = data

    def to_wire(self) -> dict:
        """Return the wire form ``{"code": str, "message": str}`` (plus ``data`` when set)."""
        out: dict = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


class RequestError(ProtocolError):
    """The request cannot be served as sent: the client's framing, envelope, method or parameters."""


class ResourceNotFound(ProtocolError):
    """The request names a thread, turn or run that does not exist."""


class StateConflict(ProtocolError):
    """The request is well formed but conflicts with the current state (busy, owned elsewhere, stale)."""


class ServerError(ProtocolError):
    """The server cannot serve the request now (overloaded), at all (unsupported), or failed."""


class ParseError(RequestError):
    """The line is not valid JSON, or is too long."""

    code = "parse_error"


class InvalidRequest(RequestError):
    """The JSON value is not a well-formed request envelope."""

    code = "invalid_request"


class MethodNotFound(RequestError):
    """No such method."""

    code = "method_not_found"


class InvalidParams(RequestError):
    """Parameters are missing, unknown or of the wrong type."""

    code = "invalid_params"


class ThreadNotFound(ResourceNotFound):
    """No thread with that id."""

    code = "thread_not_found"


class TurnNotFound(ResourceNotFound):
    """No turn with that id."""

    code = "turn_not_found"


class RunNotFound(ResourceNotFound):
    """No run with that id."""

    code = "run_not_found"


class ThreadBusy(StateConflict):
    """The thread is executing (here or in another process)."""

    code = "thread_busy"


class RunNotAttached(StateConflict):
    """The run is owned by another process."""

    code = "run_not_attached"


class StaleTurn(StateConflict):
    """The expected turn id is not the current one."""

    code = "stale_turn"


class ReadOnly(StateConflict):
    """This client may not mutate."""

    code = "read_only"


class ServerOverloaded(ServerError):
    """A bounded queue or mailbox is full; retry later."""

    code = "server_overloaded"


class Unsupported(ServerError):
    """Roost does not have this feature."""

    code = "unsupported"


class InternalError(ServerError):
    """An unexpected server failure."""

    code = "internal_error"


#: Wire code -> exception class, for every ProtocolError subclass.
PROTOCOL_ERRORS: dict[str, type[ProtocolError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequest,
        MethodNotFound,
        InvalidParams,
        ThreadNotFound,
        TurnNotFound,
        RunNotFound,
        ThreadBusy,
        RunNotAttached,
        StaleTurn,
        ReadOnly,
        ServerOverloaded,
        Unsupported,
        InternalError,
    )
}


# -- misuse -------------------------------------------------------------------------------------


class UsageError(RoostError):
    """The calling code misused a Roost API (a bug in the caller, not bad input)."""


class LifecycleError(UsageError):
    """The object's lifecycle state forbids this operation (e.g. starting a stopped actor)."""
