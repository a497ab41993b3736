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
``read <token>``; blank lines and lines starting with ``#`` are ignored. A bare ``<token>`` line is
a full token.

The Unix socket (mode 0600, so only the daemon's user can connect) needs no token: it is a full
client in the ``unix`` scope.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from collections.abc import Mapping
from pathlib import Path

import attrs

from roost.errors import ConfigError

__all__ = ["ServeAuth", "Grant", "CLIENT_ID_RE", "TOKEN_ENV_NAMES", "parse_client_id", "bearer_token"]

TOKEN_ENV_NAMES = ("FUSERAFT_SERVE_TOKEN", "ROOST_SERVE_TOKEN")
CLIENT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


@attrs.frozen
class Grant:
    """What an authenticated connection may do: its ``scope`` (token fingerprint) and read-only flag."""

    scope: str
    read_only: bool = False


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
            ConfigError: the tokens file cannot be read or has a line that is not ``full|read <token>``.
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
            for number, raw in enumerate(text.splitlines(), 1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) == 1:
                    full.add(parts[0])
                elif len(parts) == 2 and parts[0] in ("full", "read"):
                    (full if parts[0] == "full" else read).add(parts[1])
                else:
                    raise ConfigError(f"{tokens_file}:{number}: expected 'full <token>' or 'read <token>'")
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
