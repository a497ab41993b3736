"""One table from internal errors to protocol error codes, for every front door (issue 18, finding 10).

The app-server (``{"id", "error": {"code", "message"}}``), the serve daemon's ``error`` events
(Unix socket and WebSocket) and the repl dialects answer the same failure with the same string
code. :data:`ERROR_CODES` is the table, read top to bottom (the first class that matches wins);
:func:`to_protocol_error` applies it:

================================  ======================
internal error                    code
================================  ======================
``ProtocolError`` (any)           its own ``code``
``MailboxFull``, ``MailboxClosed``, ``StoreFull``, ``StoreBusy``  ``server_overloaded``
``StoreDiskFull``                 ``storage_full``
``StoreReadOnly``                 ``storage_read_only``
``StoreCorrupt``                  ``storage_corrupt``
``NotFound`` of threads/turns/runs  ``thread_not_found`` / ``turn_not_found`` / ``run_not_found``
``NotFound`` of anything else     ``not_found``
``Conflict``                      ``conflict``
``ConfigError``, ``UsageError``   ``invalid_params``
anything else                     ``internal_error`` (logged with its traceback)
================================  ======================

The ``storage_*`` codes are Roost's additions to the spec's string codes (the spec lets an
implementation add codes; a client that does not know one shows its message). Their messages say
what to do (free space; make the database writable; move a corrupt file aside), and reads keep
working while they are in force.
"""

from __future__ import annotations

import logging

from roost.errors import (
    ActorCrashed,
    ConfigError,
    Conflict,
    InternalError,
    InvalidParams,
    MailboxClosed,
    MailboxFull,
    NotFound,
    ProtocolError,
    RunNotFound,
    ServerOverloaded,
    StoreBusy,
    StoreCorrupt,
    StoreDiskFull,
    StoreFull,
    StoreReadOnly,
    ThreadNotFound,
    TurnNotFound,
    UsageError,
)

__all__ = ["ERROR_CODES", "NOT_FOUND_CODES", "error_code", "to_protocol_error", "wire_error"]

log = logging.getLogger("roost.protocol")

#: ``(internal error class, protocol code)``, first match wins. ``NotFound`` is refined by its
#: ``kind`` (:data:`NOT_FOUND_CODES`); ``ProtocolError`` keeps its own code.
ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (MailboxFull, "server_overloaded"),
    (MailboxClosed, "server_overloaded"),
    (StoreFull, "server_overloaded"),
    (StoreBusy, "server_overloaded"),
    (StoreDiskFull, "storage_full"),
    (StoreReadOnly, "storage_read_only"),
    (StoreCorrupt, "storage_corrupt"),
    (NotFound, "not_found"),
    (Conflict, "conflict"),
    (ConfigError, "invalid_params"),
    (UsageError, "invalid_params"),
    (ActorCrashed, "internal_error"),
)

#: The code of a ``NotFound`` by the table it names (``NotFound.kind``).
NOT_FOUND_CODES = {"threads": "thread_not_found", "turns": "turn_not_found", "runs": "run_not_found"}

_TYPED = {
    "thread_not_found": ThreadNotFound,
    "turn_not_found": TurnNotFound,
    "run_not_found": RunNotFound,
    "server_overloaded": ServerOverloaded,
    "invalid_params": InvalidParams,
    "internal_error": InternalError,
}


def error_code(exc: BaseException) -> str:
    """The protocol code for ``exc`` by :data:`ERROR_CODES` (``internal_error`` when none matches)."""
    if isinstance(exc, ProtocolError):
        return exc.code
    for cls, code in ERROR_CODES:
        if isinstance(exc, cls):
            if code == "not_found":
                return NOT_FOUND_CODES.get(getattr(exc, "kind", None) or "", "not_found")
            return code
    return "internal_error"


def to_protocol_error(exc: BaseException, *, context: str = "request") -> ProtocolError:
    """``exc`` as the :class:`ProtocolError` a client is sent.

    An error the table does not know (``internal_error``) is logged with its traceback, naming
    ``context``, so nothing is swallowed silently; its message names the exception type.
    """
    if isinstance(exc, ProtocolError):
        return exc
    code = error_code(exc)
    if code == "internal_error":
        log.error("internal error in %s", context, exc_info=exc)
        return InternalError(f"{type(exc).__name__}: {exc}")
    cls = _TYPED.get(code)
    if cls is not None:
        return cls(str(exc))
    error = ProtocolError(str(exc))
    error.code = code
    return error


def wire_error(exc: BaseException, *, context: str = "request") -> dict:
    """``{"code", "message"}`` of :func:`to_protocol_error` (the app-server's ``error`` member)."""
    return to_protocol_error(exc, context=context).to_wire()
