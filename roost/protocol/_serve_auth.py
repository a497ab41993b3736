"""Who may attach to ``roost serve``: bearer tokens, read tokens, Origin refusal, client ids.

wire-protocol.md, "Live sessions" (serve WebSocket row) and "Daemon events":

* ``Authorization: Bearer <token>`` is required on the WebSocket when the daemon has a token
  (``FUSERAFT_SERVE_TOKEN`` or ``ROOST_SERVE_TOKEN``, a *full* token) or a ``--tokens-file``.
  Without either, the WebSocket is open to local processes (it binds 127.0.0.1 by default).
* A *read* token attaches with ``readOnly: true``: it sees the broadcast, and its ``user_input``
  gets an ``error`` event instead of being queued.
* A handshake carrying an ``Origin`` header (a browser page) is refused with HTTP 403.
* ``Fuseraft-Client-Id``: 1-64 of ``A-Z a-z 0-9 - _``; ids are scoped to the token, so the same id
  under another token is another client.

Tokens file (``--tokens-file``): UTF-8 text, one token per line as ``full <token>`` or
``read <token>``; blank lines and lines starting with ``#`` are ignored. Anything else is refused
(a bare word could be a token or a role written without its token), so is one token listed in both
roles, and so is a file that names no token at all (it would leave every endpoint open).

The Unix socket (mode 0600, so only the daemon's user can connect) needs no token: it is a full
client in the ``unix`` scope.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio

from roost.errors import ConfigError

#: An ASGI application: ``async (scope, receive, send) -> None``.
ASGIApp = Callable[[dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]

__all__ = [
    "ServeAuth",
    "Grant",
    "CLIENT_ID_RE",
    "TOKEN_ENV_NAMES",
    "parse_client_id",
    "bearer_token",
    "RequireToken",
    "drain_body",
]

TOKEN_ENV_NAMES = ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN")
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Bytes of a refused HTTP request's body read and dropped (:func:`drain_body`), and seconds
#: spent on it at most, so that its keep-alive connection serves the next request.
DRAIN_BYTES = 64 * 1024
DRAIN_S = 10.0


@attrs.frozen
class Grant:
    """What an authenticated connection may do: its ``scope`` (token fingerprint) and read-only flag."""

    scope: str
    read_only: bool = False


def _parse_tokens(path: Path, text: str, full: set[str]) -> tuple[set[str], set[str]]:
    """``(full, read)`` token sets: ``full`` (the environment's) plus the file's lines (see the
    module docstring for the format and what is refused: :class:`ConfigError`, naming the line)."""
    read: set[str] = set()
    found = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or parts[0] not in ("full", "read"):
            hint = " (a role needs its token)" if parts[0] in ("full", "read") else ""
            raise ConfigError(f"{path}:{number}: expected 'full <token>' or 'read <token>'{hint}")
        role, token = parts
        if token in (read if role == "full" else full):  # (a full one may come from the environment)
            raise ConfigError(f"{path}:{number}: this token is both a full and a read token; keep one role")
        (full if role == "full" else read).add(token)
        found += 1
    if not found:
        raise ConfigError(
            f"{path} names no token (only blank or # lines), which would leave every endpoint open:"
            " add 'full <token>' lines, or leave out --tokens-file"
        )
    return full, read


def _fingerprint(token: str) -> str:
    return "tok-" + hashlib.sha256(token.encode()).hexdigest()[:16]


@attrs.define
class ServeAuth:
    """The daemon's tokens: ``full`` and ``read`` token sets (empty: no token required)."""

    full: frozenset[str] = frozenset()
    read: frozenset[str] = frozenset()

    @property
    def required(self) -> bool:
        return bool(self.full or self.read)

    @classmethod
    def load(cls, *, tokens_file: Path | None = None, environ: Mapping[str, str] | None = None) -> ServeAuth:
        """Tokens from the environment (full) and ``tokens_file``.

        Raises:
            ConfigError: the tokens file cannot be read, has a line that is not ``full|read <token>``,
                lists a token in both roles, or names no token.
        """
        environ = os.environ if environ is None else environ
        full: set[str] = set()
        read: set[str] = set()
        for name in TOKEN_ENV_NAMES:
            value = (environ.get(name) or "").strip()
            if value:
                full.add(value)
        if tokens_file is not None:
            try:
                text = tokens_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read the tokens file {tokens_file}: {exc}") from exc
            full, read = _parse_tokens(tokens_file, text, full)
        return cls(full=frozenset(full), read=frozenset(read))

    def check(self, token: str | None) -> Grant | None:
        """The grant for a bearer ``token`` (None: refused). Comparisons are constant-time."""
        if not self.required:
            return Grant(scope="open")
        if not token:
            return None
        for candidate in self.full:
            if hmac.compare_digest(candidate.encode(), token.encode()):
                return Grant(scope=_fingerprint(token))
        for candidate in self.read:
            if hmac.compare_digest(candidate.encode(), token.encode()):
                return Grant(scope=_fingerprint(token), read_only=True)
        return None


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value (None when absent or another scheme)."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def parse_client_id(value: str | None) -> str | None:
    """Validate a ``Fuseraft-Client-Id`` header value.

    Returns:
        The id, or None when the header is absent.

    Raises:
        ValueError: the value is not 1-64 of ``A-Z a-z 0-9 - _``.
    """
    if value is None:
        return None
    if not CLIENT_ID_RE.fullmatch(value):
        raise ValueError("Fuseraft-Client-Id must be 1-64 of A-Z a-z 0-9 - _")
    return value


class RequireToken:
    """ASGI middleware: every HTTP request is authenticated on its own (issue 18, finding 1).

    A keep-alive connection carries many requests, and an MCP session id is never a credential:
    each request must carry ``Authorization: Bearer <full token>`` when the daemon has tokens
    (401 otherwise), a read token is refused with 403 (the MCP tools mutate), and so is any
    request with an ``Origin`` header (a browser page); a refused request's body is read first
    (:func:`drain_body`), so the connection serves the next one. Non-HTTP scopes (``lifespan``) pass.

    Args:
        app: the ASGI application to protect.
        auth: the daemon's tokens.
    """

    def __init__(self, app: ASGIApp, auth: ServeAuth) -> None:
        self.app = app
        self.auth = auth
        # Starlette's lifespan and router are reached through the wrapped app (e.g. ``.router``).
        self.router = getattr(app, "router", None)

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {
            bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope.get("headers") or ()
        }
        refusal = self.refusal(headers)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, body = refusal
        await drain_body(scope, receive)
        extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()), *extra],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def refusal(self, headers: dict[str, str]) -> tuple[int, bytes] | None:
        """``(status, body)`` for a request that may not proceed, None for one that may."""
        if "origin" in headers:
            return 403, b"refused: a request with an Origin header is not accepted\n"
        grant = self.auth.check(bearer_token(headers.get("authorization")))
        if grant is None:
            return 401, b"unauthorized: send Authorization: Bearer <token>\n"
        if grant.read_only:
            return 403, b"a read token cannot use the MCP tools\n"
        return None


async def drain_body(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]]) -> None:
    """Read and drop the body of an ASGI HTTP request about to be refused unread.

    Hypercorn keeps an HTTP/1.1 connection for the next request only when the request's whole
    body has arrived by the time its response ends; a refusal sent before then (a wrong token on
    a ``POST``) would close the connection. So up to :data:`DRAIN_BYTES` bytes, for at most
    :data:`DRAIN_S` seconds, are read first; a request declaring a longer body (its
    ``content-length``), or sending more or slower, is refused without it (its connection then
    closes). Returns at once for a request without a body.
    """
    for name, value in scope.get("headers") or ():
        length = bytes(value).strip()
        if bytes(name).lower() == b"content-length" and length.isdigit() and int(length) > DRAIN_BYTES:
            return
    read = 0
    with trio.move_on_after(DRAIN_S):
        while read <= DRAIN_BYTES:
            message = await receive()
            if message.get("type") != "http.request":
                return
            read += len(message.get("body") or b"")
            if not message.get("more_body"):
                return
