"""Provider path CPU (issue 19, "Provider path"): server CPU per 100-delta turn on the OpenAI Chat and
OpenAI Responses providers, against the scripted engine, through the real ``roost app-server``.

Goal: CPU per turn on each HTTP provider within 1.5x of the scripted engine's.

For each provider, one ``roost app-server`` process (fresh ``ROOST_HOME``) runs ``--warmup`` untimed
turns and then ``--turns`` sequential turns on one thread; every reply is ``--deltas`` text deltas
of ``"tok "``. The HTTP providers talk to a mock server in a separate process (so its CPU is not
counted) that writes each reply in one network chunk, like the peers harness's Responses mock
(``../shared/peers/mock_responses.py``): the Responses stream is that mock's full event sequence
(``response.created``, ``.in_progress``, ``output_item.added``, ``content_part.added``, N deltas,
``output_text.done``, ``content_part.done``, ``output_item.done``, ``response.completed`` with the
whole output and usage); the Chat stream is a role chunk, N content chunks, a finish chunk, a
usage chunk with empty ``choices`` and ``[DONE]``. The scripted engine plays the same text with
zero pacing. Server CPU is utime+stime of the server process from ``/proc/<pid>/stat`` (10 ms
ticks, averaged over the turns); the client checks every turn delivered all its text.

Run: ``.venv/bin/python benchmarks/bench_provider_path.py [--turns 200] [--warmup 20] [--deltas 100]
[--repeat 3] [--pythonpath DIR]`` (``--pythonpath`` runs the server from another copy of the
``roost`` package, e.g. a checkout of the previous commit, to measure before/after in one run).
Linux only (``/proc``).

Output (one JSON line on stdout):

* ``benchmark``: ``"provider_path"``; ``turns``, ``deltas``, ``repeat``: the sizes (counts);
  ``pythonpath``: the ``--pythonpath`` given (or null); ``loadavg``: the machine's 1-minute load
  average at the end;
* ``providers``: one object per provider, ``scripted``, ``openai`` and ``openai-responses``, of
  * ``cpu_ms_per_turn``: server CPU per timed turn, in ms, the median over the repeats
    (``cpu_ms_per_turn_min``: the smallest; ``cpu_ms_per_turn_runs``: each repeat's, a list),
  * ``wall_ms_per_turn``: wall time per turn, in ms (median),
  * ``delta_lines_per_turn``: delta lines the client received per turn (the smallest of the
    repeats),
  * for ``openai`` and ``openai-responses`` only: ``ratio_to_scripted`` (the medians' ratio) and
    ``ratio_to_scripted_of_mins`` (the minimums' ratio);
* ``engine_only``: per provider, CPU ms per model call of each engine alone (in a client process,
  a 100-message history): ``cpu_ms_per_call_min`` and ``cpu_ms_per_call_median`` of the repeats;
* ``meets_target``: whether both HTTP providers' ``ratio_to_scripted`` is at most 1.5 (a boolean).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import socket
import socketserver
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _appclient import open_app_client
from _util import arg_parser, emit

TEXT = "tok "
TARGET_RATIO = 1.5


# -- the mock model server (a separate process: `--mock`) ------------------------------------------


def _chat_stream(deltas: int) -> bytes:
    def chunk(delta: dict, finish: str | None = None) -> bytes:
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": TEXT}) for _ in range(deltas)]
    parts.append(chunk({}, "stop"))
    usage = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": deltas, "total_tokens": 10 + deltas},
    }
    parts.append(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _responses_stream(deltas: int) -> bytes:
    seq = [0]
    out: list[bytes] = []

    def ev(obj: dict) -> None:
        obj["sequence_number"] = seq[0]
        seq[0] += 1
        out.append(b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), json.dumps(obj, separators=(",", ":")).encode()))

    def response(status: str, output: list, tokens: int) -> dict:
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "status": status,
            "model": "m",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 10,
                "output_tokens": tokens,
                "total_tokens": 10 + tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
            if tokens
            else None,
        }

    ev({"type": "response.created", "response": response("in_progress", [], 0)})
    ev({"type": "response.in_progress", "response": response("in_progress", [], 0)})
    item = {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}
    ev({"type": "response.output_item.added", "output_index": 0, "item": item})
    ev(
        {
            "type": "response.content_part.added",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "part": {"type": "output_text", "text": "", "annotations": []},
        }
    )
    for _ in range(deltas):
        ev(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": TEXT,
            }
        )
    part = {"type": "output_text", "text": TEXT * deltas, "annotations": []}
    ev(
        {
            "type": "response.output_text.done",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "text": TEXT * deltas,
        }
    )
    ev({"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0, "content_index": 0, "part": part})
    done = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [part]}
    ev({"type": "response.output_item.done", "output_index": 0, "item": done})
    ev({"type": "response.completed", "response": response("completed", [done], deltas)})
    return b"".join(out)


def serve_mock(deltas: int) -> None:
    """Serve both streams on a loopback port (printed as ``LISTENING <port>``) until stdin closes."""
    bodies = {"/v1/chat/completions": _chat_stream(deltas), "/v1/responses": _responses_stream(deltas)}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            # headers and body are written separately: without this a reused connection waits
            # for the client's delayed ACK (about 40 ms) before the body goes out
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            body = bodies.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))  # one network chunk
            self.wfile.flush()

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    print(f"LISTENING {server.server_address[1]}", flush=True)
    import threading

    threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdin.read()


# -- the measured server -----------------------------------------------------------------------------


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_env(provider: str, home: str, port: int, script: str, pythonpath: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOST_")}
    env.update(ROOST_HOME=home, ROOST_PROVIDER=provider, ROOST_MODEL="m", OPENAI_API_KEY="sk-bench")
    if provider == "scripted":
        env["ROOST_SCRIPT"] = script
    else:
        env["ROOST_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


async def measure(provider: str, *, port: int, turns: int, warmup: int, deltas: int, pythonpath: str | None) -> dict:
    """One server process: warm-up, then ``turns`` timed turns; returns CPU ms per turn."""
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.yaml"
        script.write_text(json.dumps({"rules": [{"steps": [[{"text": TEXT * deltas, "deltas": deltas}]]}]}))
        env = _server_env(provider, str(Path(tmp) / "home"), port, str(script), pythonpath)
        argv = [sys.executable, "-m", "roost", "app-server"]
        async with open_app_client(argv, env=env, cwd=tmp) as client:
            await client.request("initialize", {"protocol_version": "wuu-app-server/v0.1"})
            thread = (await client.request("thread/start", {"ephemeral": False}))["thread"]
            pid = client.process.pid

            async def turn() -> None:
                _, started = await client.start_turn(thread["id"], "go")
                params, _ = await client.wait_terminal(started["id"])
                assert params["turn"]["status"] == "completed", params

            for _ in range(warmup):
                await turn()
            before_deltas = client.deltas
            cpu0, wall0 = _cpu_s(pid), time.perf_counter()
            for _ in range(turns):
                await turn()
            cpu1, wall1 = _cpu_s(pid), time.perf_counter()
            delivered = client.deltas - before_deltas
    return {
        "cpu_ms_per_turn": round((cpu1 - cpu0) * 1000 / turns, 3),
        "wall_ms_per_turn": round((wall1 - wall0) * 1000 / turns, 3),
        "delta_lines_per_turn": round(delivered / turns, 1),
    }


async def engine_only(provider: str, port: int, calls: int, deltas: int) -> float:
    """CPU ms per model call of the engine alone, in this process (the mock's CPU is not counted):
    a 100-message history, ``deltas`` text deltas per reply."""
    from roost.engines import AgentMessage, EngineRequest, ProviderSettings, UserMessage, open_engine

    history: list = []
    for _ in range(50):
        history += [UserMessage("go"), AgentMessage(TEXT * deltas)]
    request = EngineRequest(history=[*history, UserMessage("go")])
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps({"rules": [{"steps": [[{"text": TEXT * deltas, "deltas": deltas}]]}]}))
        settings = ProviderSettings(
            provider=provider, base_url=f"http://127.0.0.1:{port}/v1", model="m", api_key="sk-bench", script=str(script)
        )
        engine = open_engine(settings, pacing=False)
        try:

            async def call() -> None:
                async with engine.stream(request) as events:
                    async for _ in events:
                        pass

            for _ in range(20):
                await call()
            start = time.process_time()
            for _ in range(calls):
                await call()
            return (time.process_time() - start) * 1000 / calls
        finally:
            await engine.aclose()


def engine_figures(port: int, args: argparse.Namespace) -> dict:
    """Run :func:`engine_only` per provider in child processes (``--pythonpath`` applies), min of
    the repeats (the least disturbed by other load)."""
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    out: dict = {}
    for provider in ("scripted", "openai", "openai-responses"):
        samples = []
        for _ in range(args.repeat):
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--engine-only",
                    provider,
                    "--port",
                    str(port),
                    "--deltas",
                    str(args.deltas),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            samples.append(float(done.stdout.split()[-1]))
        out[provider] = {
            "cpu_ms_per_call_min": round(min(samples), 3),
            "cpu_ms_per_call_median": round(statistics.median(samples), 3),
        }
    return out


async def main(args: argparse.Namespace) -> dict:
    mock = subprocess.Popen(
        [sys.executable, __file__, "--mock", "--deltas", str(args.deltas)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mock.stdout is not None
        port = int(mock.stdout.readline().split()[1])
        engine = engine_figures(port, args)
        providers = ["scripted", "openai", "openai-responses"]
        runs: dict[str, list[dict]] = {p: [] for p in providers}
        for _ in range(args.repeat):  # alternate the providers within each repeat
            for provider in providers:
                runs[provider].append(
                    await measure(
                        provider,
                        port=port,
                        turns=args.turns,
                        warmup=args.warmup,
                        deltas=args.deltas,
                        pythonpath=args.pythonpath,
                    )
                )
    finally:
        assert mock.stdin is not None
        mock.stdin.close()
        mock.wait(10)
    out: dict = {
        "benchmark": "provider_path",
        "turns": args.turns,
        "deltas": args.deltas,
        "repeat": args.repeat,
        "pythonpath": args.pythonpath,
        "loadavg": os.getloadavg()[0],
        "providers": {},
    }
    for provider, samples in runs.items():
        out["providers"][provider] = {
            "cpu_ms_per_turn": statistics.median(s["cpu_ms_per_turn"] for s in samples),
            "wall_ms_per_turn": statistics.median(s["wall_ms_per_turn"] for s in samples),
            "cpu_ms_per_turn_min": min(s["cpu_ms_per_turn"] for s in samples),
            "cpu_ms_per_turn_runs": [s["cpu_ms_per_turn"] for s in samples],
            "delta_lines_per_turn": min(s["delta_lines_per_turn"] for s in samples),
        }
    base = out["providers"]["scripted"]["cpu_ms_per_turn"]
    for provider in ("openai", "openai-responses"):
        figures = out["providers"][provider]
        figures["ratio_to_scripted"] = round(figures["cpu_ms_per_turn"] / base, 2)
        figures["ratio_to_scripted_of_mins"] = round(
            figures["cpu_ms_per_turn_min"] / out["providers"]["scripted"]["cpu_ms_per_turn_min"], 2
        )
    out["engine_only"] = engine
    out["meets_target"] = all(
        out["providers"][p]["ratio_to_scripted"] <= TARGET_RATIO for p in ("openai", "openai-responses")
    )
    return out


if __name__ == "__main__":
    parser = arg_parser(__doc__)
    parser.add_argument("--turns", type=int, default=200, help="timed turns per server (default 200)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed turns first (default 20)")
    parser.add_argument("--deltas", type=int, default=100, help="text deltas per reply (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per provider, alternating (default 3)")
    parser.add_argument("--pythonpath", default=None, help="run the server from DIR/roost instead of this checkout")
    parser.add_argument("--mock", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--engine-only", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mock:
        serve_mock(args.deltas)
    elif args.engine_only:
        print(round(trio.run(engine_only, args.engine_only, args.port, 300, args.deltas), 4))
    else:
        emit(trio.run(main, args))
