"""Readable rendering of app-server notifications for terminals (``roost demo``, ``roost exec``)."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from roost._json import loads
from roost.protocol import silence_stdout

__all__ = ["TextRenderer"]

_DIM, _BOLD, _CYAN, _YELLOW, _RED, _GREEN, _RESET = (
    "\033[2m",
    "\033[1m",
    "\033[36m",
    "\033[33m",
    "\033[31m",
    "\033[32m",
    "\033[0m",
)


class TextRenderer:
    """A hub Subscriber that prints a turn as it happens: text streamed, tools and results framed.

    Args:
        out: where to write (default stdout).
        color: use ANSI colours (default: when ``out`` is a terminal).
    """

    def __init__(self, out: TextIO | None = None, *, color: bool | None = None) -> None:
        self.out = out or sys.stdout
        self.color = self.out.isatty() if color is None else color
        self._open_text: str | None = None
        self.final_status: str | None = None
        self.closed = False
        self.final_turn: dict | None = None

    def _c(self, code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text

    def deliver(self, line: bytes) -> None:
        if self.closed:
            return
        message = loads(line)
        try:
            self.render(message.get("method", ""), message.get("params") or {})
        except BrokenPipeError:  # e.g. `roost demo | head`: stop writing, quietly
            self.closed = True
            silence_stdout()

    def _end_text(self) -> None:
        if self._open_text is not None:
            self.out.write("\n")
            self._open_text = None

    def render(self, method: str, params: dict[str, Any]) -> None:
        out = self.out
        if method == "item/agentMessage/delta":
            if self._open_text != params["item_id"]:
                self._end_text()
                out.write(self._c(_BOLD, "assistant› "))
                self._open_text = params["item_id"]
            out.write(params["delta"])
        elif method in ("item/agentMessage/replace", "item/reasoning/replace"):
            self._end_text()  # a retried stream: its text starts over under a new prefix
            out.write(self._c(_DIM, "(the model stream was retried; the reply starts again)") + "\n")
            if params.get("text"):
                self.render(method.replace("/replace", "/delta"), {**params, "delta": params["text"]})
        elif method == "item/reasoning/delta":
            if self._open_text != params["item_id"]:
                self._end_text()
                out.write(self._c(_DIM, "thinking› "))
                self._open_text = params["item_id"]
            out.write(self._c(_DIM, params["delta"]))
        elif method == "item/started" and params["item"]["type"] == "user_message":
            self._end_text()
            out.write(self._c(_CYAN, f"you› {params['item'].get('text', '')}") + "\n")
        elif method == "item/completed" and params["item"]["type"] == "tool_call":
            self._end_text()
            item = params["item"]
            args = item.get("arguments") or {}
            shown = " ".join(f"{k}={v!r}" for k, v in args.items())
            mark = self._c(_RED, "✗") if item.get("is_error") else self._c(_GREEN, "✓")
            out.write(self._c(_YELLOW, f"$ {item['name']} {shown}") + f" {mark}\n")
            output = (item.get("output") or "").rstrip()
            lines = output.splitlines()
            for text in lines[:8]:
                out.write(self._c(_DIM, f"  │ {text}") + "\n")
            if len(lines) > 8:
                out.write(self._c(_DIM, f"  │ … {len(lines) - 8} more lines") + "\n")
        elif method in ("turn/completed", "turn/error"):
            self._end_text()
            turn = params["turn"]
            self.final_status = turn["status"]
            self.final_turn = turn
            usage = turn.get("usage") or {}
            tokens = f"{usage.get('input_tokens', 0)} in / {usage.get('output_tokens', 0)} out tokens"
            summary = f"[turn {turn['status']}; {tokens}]"
            if turn.get("error") and turn["status"] != "completed":
                summary += f" {turn['error'].get('category')}: {turn['error'].get('message')}"
            colour = _GREEN if turn["status"] == "completed" else _RED
            out.write(self._c(colour, summary) + "\n")
        elif method == "agent/updated":
            self._end_text()
            agent = params["agent"]
            indent = "  " * agent.get("depth", 1)
            colour = {"completed": _GREEN, "failed": _RED, "interrupted": _RED, "cancelled": _RED}.get(
                agent["status"], _YELLOW
            )
            line = f"{indent}⎿ worker {agent['name']} (depth {agent.get('depth')}): {agent['status']}"
            if agent.get("description"):
                line += f" — {agent['description']}"
            out.write(self._c(colour, line) + "\n")
        elif method == "agent/mailbox":
            self._end_text()
            message = params["message"]
            out.write(
                self._c(_DIM, f"  ✉ result of {message.get('from_name')} delivered ({message.get('status')})") + "\n"
            )
        elif method == "turn/held":
            self._end_text()
            out.write(self._c(_DIM, f"[held for later: {params['input'].get('prompt')!r}]") + "\n")
        out.flush()
