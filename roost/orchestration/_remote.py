"""``RemoteAgent``: an orchestration agent that is a proxy for a remote A2A agent.

wire-protocol.md, appendix "Orchestration config": an agent may be a proxy for a remote A2A agent
with ``RemoteAgent: {Url, TimeoutSeconds}``; its agent card is read from
``{Url}/.well-known/agent.json``. Each of the agent's turns sends the conversation's latest message
(the task, or the previous agent's message) to the remote agent with the official ``a2a-sdk``
client (``A2ACardResolver``, ``ClientFactory``: JSON-RPC ``message/send``, A2A spec 0.3) and the
remote answer (its ``result`` artifact, else its status message or reply message) becomes this
agent's message, so the run's thread, persistence, events and routing treat it like any agent's.

The proxy is a model :class:`~roost.engines.Engine` (:class:`RemoteAgentEngine`): the turn
machinery runs unchanged. A remote failure (unreachable, HTTP error, a card that does not parse,
a task that ends ``failed``/``canceled``) or a timeout (``TimeoutSeconds`` for the card read and
the call together) does not fail the run: the agent's message is a one-line error naming the
remote URL, ``[remote agent <Url> failed: <why>]``, logged as a warning, and the run goes on (the
next agent, or the termination strategy, sees it). A remote Roost daemon with tokens takes the
bearer token from the environment variable named by the additive ``TokenEnv`` key.

A run keeps one remote conversation per proxy agent: the first call sends no ``contextId`` and
the answer's ``contextId`` (its task's, or its message's) is kept in ``contexts`` (proxy agent
name -> context id); each later call of the run to that agent sends it, so the remote agent sees
its earlier messages (A2A spec 0.3, "Life of a task": the same ``contextId`` continues an
interaction); a kept id the remote agent refuses is dropped for a new context (see
:meth:`RemoteAgentEngine._send`). The :class:`~roost.orchestration.Orchestrator` shares one
``contexts`` dict with the run's proxies and saves it in the run's thread metadata
(``remote_contexts``), so ``--resume`` and a daemon restart keep the remote conversation.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

from roost.engines import AgentMessage, EngineEvent, EngineRequest, Finish, ModelInfo, TextDelta, UserMessage

__all__ = ["RemoteAgentEngine"]

log = logging.getLogger("roost.orchestration")

#: The card path the wire spec names (``{Url}/.well-known/agent.json``; the SDK serves it too).
CARD_PATH = "/.well-known/agent.json"
#: JSON-RPC "Invalid params": how an A2A agent refuses an unusable ``contextId``.
_INVALID_PARAMS = -32602


@attrs.define(eq=False)
class RemoteAgentEngine:
    """The engine of a ``RemoteAgent`` proxy (see the module doc).

    Args:
        agent: the proxy agent's name (for messages and logs).
        url: the remote agent's base URL (``http(s)://...``; the card is at ``{url}/.well-known/agent.json``).
        timeout: seconds one call may take, card read included (``TimeoutSeconds``).
        token: a bearer token sent on every request (None: none).
        contexts: the run's remote context ids, proxy agent name -> ``contextId`` (read before a
            call, written after one that answered; see the module doc).
    """

    agent: str
    url: str
    timeout: float
    token: str | None = None
    contexts: dict[str, str] = attrs.field(factory=dict)
    name: str = "a2a"

    @classmethod
    def from_spec(cls, agent: str, spec: Any, contexts: dict[str, str] | None = None) -> RemoteAgentEngine:
        """The engine of an agent's ``RemoteAgent`` spec (``url``, ``timeout_seconds``,
        ``token_env``); ``contexts``: the run's shared context ids (None: the engine's own)."""
        token = os.environ.get(spec.token_env) if spec.token_env else None
        return cls(
            agent=agent,
            url=spec.url.rstrip("/"),
            timeout=spec.timeout_seconds,
            token=token or None,
            contexts=contexts if contexts is not None else {},
        )

    @asynccontextmanager
    async def stream(self, request: EngineRequest) -> AsyncIterator[AsyncIterator[EngineEvent]]:
        """One turn: the remote agent's answer as one text delta, then ``Finish("stop")``."""
        yield self._events(request)

    async def _events(self, request: EngineRequest) -> AsyncIterator[EngineEvent]:
        reply = await self.ask(_latest_text(request))
        yield TextDelta(reply)
        yield Finish("stop")

    async def ask(self, text: str) -> str:
        """Send ``text`` to the remote agent; its answer, or the one-line error (never raises an
        error of the remote side; cancellation propagates)."""
        try:
            with trio.fail_after(self.timeout):
                return await self._call(text)
        except trio.TooSlowError:
            why = f"no answer within {self.timeout:g} s (TimeoutSeconds)"
        except RemoteFailed as exc:
            why = str(exc)
        except Exception as exc:  # the SDK's A2AClientError family, httpx errors, pydantic ValidationError
            why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.warning("agent %s: remote agent %s failed: %s", self.agent, self.url, why)
        return f"[remote agent {self.url} failed: {why}]"

    async def _call(self, text: str) -> str:
        from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
        from a2a.types import Message, Task, TaskState

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        async with httpx.AsyncClient(timeout=self.timeout, headers=headers) as http:
            card = await A2ACardResolver(http, self.url, agent_card_path=CARD_PATH).get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            last = await self._send(client, text)
        if isinstance(last, Message):
            self._keep_context(last.context_id)
            return _parts_text(last.parts)
        if not isinstance(last, tuple) or not isinstance(last[0], Task):
            raise RemoteFailed("the remote agent sent no task or message")
        task: Task = last[0]
        self._keep_context(task.context_id)
        status_text = _parts_text(task.status.message.parts) if task.status.message else ""
        if task.status.state != TaskState.completed:
            ended = f"its task ended {task.status.state.value}"
            raise RemoteFailed(f"{ended}: {status_text}" if status_text else ended)
        artifacts = "\n".join(_parts_text(a.parts) for a in task.artifacts or [])
        return artifacts or status_text or "(the remote agent answered with no text)"

    async def _send(self, client: Any, text: str) -> Any:
        """Send ``text`` in the run's context with this agent; the client's last event.

        A kept ``contextId`` the remote agent refuses (JSON-RPC ``-32602``: e.g. its previous
        task, one that outlived ``TimeoutSeconds``, still runs; or it belongs to another caller)
        is forgotten, with a warning, and the message is sent again without one: a new remote
        context, rather than an agent that fails on every later call of the run.
        """
        from a2a.client.errors import A2AClientJSONRPCError
        from a2a.types import Message, Part, Role, TextPart

        context_id = self.contexts.get(self.agent)
        while True:
            message = Message(
                role=Role.user,
                parts=[Part(root=TextPart(text=text))],
                message_id=uuid.uuid4().hex,
                context_id=context_id,
            )
            last: Any = None
            try:
                async for event in client.send_message(message):
                    last = event
                return last
            except A2AClientJSONRPCError as exc:
                if context_id is None or exc.error.code != _INVALID_PARAMS:
                    raise
                log.warning(
                    "agent %s: remote agent %s refused context %s (%s); starting a new one",
                    self.agent,
                    self.url,
                    context_id,
                    exc.error.message,
                )
                self.contexts.pop(self.agent, None)
                context_id = None

    def _keep_context(self, context_id: str | None) -> None:
        """Keep the answer's ``contextId`` for the run's next call to this agent (None: keep the old)."""
        if context_id:
            self.contexts[self.agent] = context_id

    async def list_models(self) -> list[ModelInfo]:
        return [ModelInfo(id=self.url, current=True)]

    async def aclose(self) -> None:
        return None


class RemoteFailed(Exception):
    """The remote agent answered, but not with a usable result (the message says why)."""


def _latest_text(request: EngineRequest) -> str:
    """The latest user or agent message of the conversation (the task for the run's first turn)."""
    for item in reversed(request.history):
        if isinstance(item, UserMessage | AgentMessage) and item.text.strip():
            return item.text
    return request.prompt


def _parts_text(parts: Any) -> str:
    return "\n".join(getattr(p.root, "text", "") for p in parts or [] if getattr(p.root, "text", "")).strip()
