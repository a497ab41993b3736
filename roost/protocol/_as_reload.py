"""Configuration reload for ``roost app-server`` (app-server-protocol.md, "Transport and
initialization"): watch the configuration file and publish ``config/error`` / ``config/changed``.

- The file (``$ROOST_HOME/config.toml``, or hosted mode's ``--config FILE``) is read every
  :data:`POLL_S` seconds (in a worker thread) and compared with the bytes seen last; a change is
  checked once two reads :data:`SETTLE_S` apart agree (an editor's truncate-then-write is one
  edit). Polling, not inotify: the file's directory usually holds the store's database, whose WAL
  is written about 60 times per turn, and a directory watch (watchfiles) woke its thread for every
  one of those writes (a third of a millisecond of CPU per turn in ``bench_appserver.py``), while
  watchfiles' own polling backend compares mtimes in whole seconds and misses quick edits.
- An edited document is checked the way start-up checks it, by the same functions: it must load
  (:func:`roost.config.parse_config`: TOML, or JSON for a ``.json`` name, with no unknown key
  and a well-formed ``[mcp_servers]`` table) and resolve to a usable provider
  (:func:`roost.config.resolve_provider`, with the server's own flags first); a scripted
  provider's script must open. ``[mcp_servers]`` is checked, but the servers connected are those
  of the start (a change applies at the next start).
- A document the server started with that is rejected (it does not load, or does not resolve to
  a usable provider: the server starts anyway, ``initialize`` answering ``needs_setup``) is sent as
  ``config/error`` once the first ``initialize`` is answered, as a reload would send it; with no
  file at all, ``needs_setup`` alone says what to set.
- A rejected document sends ``config/error`` ``{path, message}`` once per distinct document
  (sha256 of its bytes; a missing file counts as one document). The previous selection and
  provider inventory stay for display (``initialize``, ``engine/list``), but
  :attr:`EngineCatalog.config_error <roost.protocol._engines.EngineCatalog>` refuses turns and
  configuration mutations until the file is repaired.
- An accepted document after a rejection (including the previous contents restored), or a valid
  document that differs from the last accepted one, sends ``config/changed`` ``{path, status,
  model, providers}`` and becomes the selection of threads that use the default provider.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from roost.config import parse_config
from roost.engines import ProviderSettings
from roost.errors import ConfigError, InvalidParams

__all__ = ["ConfigReloader"]

log = logging.getLogger("roost.appserver.reload")

#: Seconds between two reads of the configuration file.
POLL_S = 0.25
#: Seconds between the read that saw a change and the one that must agree before it is checked.
SETTLE_S = 0.05


class ConfigReloader:
    """Watches one configuration file for one app-server session.

    Args:
        session: the :class:`~roost.protocol._appserver.AppServerSession` to notify and update.
        path: the configuration file (it may not exist yet; its directory must).
        resolve: resolves the provider settings from the file (flags and environment applied as at
            start-up); raises :class:`ConfigError`.
    """

    def __init__(self, session: Any, path: Path, resolve: Callable[[], ProviderSettings]) -> None:
        self.session = session
        self.path = Path(path).absolute()
        self.resolve = resolve
        self.accepted_digest: str | None = None
        self.rejected_digest: str | None = None
        #: the bytes of the document last seen by :meth:`prime` or :meth:`run` (None: missing)
        self._seen: bytes | None | ConfigError = None
        #: the document the server started with cannot be loaded: :meth:`run` sends it first
        self.start_error: ConfigError | None = None

    def _read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ConfigError(f"cannot read {self.path}: {exc.strerror or exc}") from exc

    def _snapshot(self) -> bytes | None | ConfigError:
        """The document's bytes now (None: missing; the error: unreadable)."""
        try:
            return self._read()
        except ConfigError as exc:
            return exc

    def _check(self) -> tuple[str, ProviderSettings | ConfigError]:
        """Read and validate the document: ``(digest, settings or the rejection)``. The document
        is checked by :func:`roost.config.parse_config`, the function every start-up reads the
        file with (its syntax, unknown keys, the ``[mcp_servers]`` table), then resolved."""
        data = self._snapshot()
        self._seen = data
        if isinstance(data, ConfigError):
            return "unreadable", data
        digest = hashlib.sha256(b"missing" if data is None else b"doc:" + data).hexdigest()
        try:
            if data is not None:
                parse_config(data, self.path)
        except ConfigError as exc:
            return digest, _Broken(str(exc))
        try:
            settings = self.resolve()
            if settings.provider == "scripted":
                self.session.engines.engine_for_settings(settings)  # the script must open
        except InvalidParams as exc:
            return digest, ConfigError(str(exc))
        except ConfigError as exc:
            return digest, exc
        return digest, settings

    def prime(self) -> None:
        """Record the document the server started with (no notification)."""
        digest, outcome = self._check()
        if isinstance(outcome, ConfigError):
            self.rejected_digest = digest
            if self.session.engines.default is not None:
                # edited since the engines were made (after an early initialize answer): rejected
                self.session.engines.config_error = str(outcome)
                self.start_error = outcome
            elif isinstance(outcome, _Broken) or digest == "unreadable" or self._seen is not None:
                # a document that does not load, or does not resolve to a usable provider (a
                # wrong type, an unknown provider, a missing script), as a reload would report
                # it; with no file at all there is nothing that failed to load (needs_setup only).
                # The message is the one initialize reports.
                setup_error = self.session.engines.setup_error
                self.start_error = ConfigError(setup_error) if setup_error else outcome
        else:
            self.accepted_digest = digest

    async def check_now(self) -> None:
        """Validate the current document and notify as the module docstring describes."""
        digest, outcome = await trio.to_thread.run_sync(self._check)
        engines = self.session.engines
        if isinstance(outcome, ConfigError):
            if digest == self.rejected_digest:
                return  # an unchanged rejected document does not emit repeated errors
            self.rejected_digest = digest
            if engines.default is not None:
                engines.config_error = str(outcome)
            self.session.notify("config/error", {"path": str(self.path), "message": str(outcome)})
            return
        recovering = self.rejected_digest is not None
        if digest == self.accepted_digest and not recovering:
            return
        self.accepted_digest, self.rejected_digest = digest, None
        engines.default = outcome
        engines.setup_error = None
        engines.config_error = None
        self.session.settings = outcome
        self.session.setup_issues = []
        from roost.protocol._as_config import provider_inventory

        providers = await trio.to_thread.run_sync(provider_inventory, self.session)
        self.session.notify(
            "config/changed",
            {"path": str(self.path), "status": "ready", "model": outcome.describe(), "providers": providers},
        )

    async def run(self) -> None:
        """Poll until cancelled (see the module doc); an edit made between :meth:`prime` and the
        first poll is not missed; a document the server started with that does not load is
        sent first as ``config/error``. Cancellation: at its next sleep or once a read returns."""
        if self.start_error is not None:
            error, self.start_error = self.start_error, None
            self.session.notify("config/error", {"path": str(self.path), "message": str(error)})
        if not self.path.parent.is_dir():
            log.warning("not watching %s: its directory does not exist", self.path)
            return
        while True:
            await trio.sleep(POLL_S)
            now = await trio.to_thread.run_sync(self._snapshot)
            if _same(now, self._seen):
                continue
            await trio.sleep(SETTLE_S)
            again = await trio.to_thread.run_sync(self._snapshot)
            if not _same(now, again):
                continue  # still being written: the next poll looks again
            try:
                await self.check_now()
            except Exception:  # a reload failure must never end the session
                log.exception("configuration reload failed")


class _Broken(ConfigError):
    """The document itself does not load (:func:`roost.config.parse_config` refused it)."""


def _same(a: bytes | None | ConfigError, b: bytes | None | ConfigError) -> bool:
    if isinstance(a, ConfigError) or isinstance(b, ConfigError):
        return isinstance(a, ConfigError) and isinstance(b, ConfigError)
    return a == b
