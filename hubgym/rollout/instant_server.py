"""An OpenAI-compatible server that answers at once: measures rollout clients, not the model.

On a GPU-served vLLM the client (env steps, templates, tools, scoring, writing) bounds multi-turn
rollouts; on a CPU machine vLLM bounds everything. This server speaks the part of vLLM's API the
rollout clients read and answers each request with a valid pre-generated reply (`instant_replies`),
so a benchmark against it measures the client alone:

- `POST /v1/completions`: token-in (`prompt` = ids), `n` choices with `token_ids`, `prompt_token_ids`
  (`return_token_ids`), `text`, `logprobs.token_logprobs` / `tokens`, `finish_reason`;
- `POST /v1/chat/completions`: the model's chat template rendered and tokenized (the top-level
  `prompt_token_ids`, as vLLM returns them), hermes tool calls (`tool_calls`, finish_reason
  "tool_calls"), `logprobs.content`, `token_ids`; `kv_transfer_params.prompt_token_ids` skips templating;
  `stream: true` answers as server-sent events (the clients that stream, such as verifiers' harnesses);
- `GET /v1/models`, `GET /health`, `GET /metrics` (vLLM's counter names: generated and prompt tokens, requests).

Every route also answers under an env prefix, `/<env>/v1/...`, which picks the env's replies (else
`--env`). It runs in its own processes (`--workers`, one listening socket shared by forked uvicorn
workers) so the client under test does not pay for it; `InstantServer.cpu_s()` says what it used.

    python -m hubgym.rollout.instant_server MODEL_DIR --port 8100 --workers 1
    with InstantServer(model_dir) as server:      # base_url for wordle: server.url("wordle")
        run_rollouts(RolloutConfig(envs=["wordle"], ..., engine="openai", base_url=server.url("wordle")))
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

from hubgym.errors import EngineError
from hubgym.rollout.instant_replies import ENVS, Reply, ReplyBook
from hubgym.engines.server import free_port

COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "http_requests_total")


class InstantApp:
    """The bare ASGI app (no framework: routing is a dict lookup, JSON is msgspec)."""

    def __init__(self, model: str, default_env: str, counters: Any = None, slot: int = 0):
        import msgspec
        from transformers import AutoTokenizer
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self.model, self.default_env = model, default_env
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.backend = self.tokenizer.backend_tokenizer
        self.template = _compile_jinja_template(self.tokenizer.chat_template)
        self.books = {env: ReplyBook(env, self.tokenizer) for env in ENVS}
        self.im_start = self.tokenizer.convert_tokens_to_ids("<|im_start|>")
        self.assistant = self.tokenizer.encode("assistant", add_special_tokens=False)
        self.encode, self.decode = msgspec.json.encode, msgspec.json.decode
        self.counters, self.slot = counters, slot  # shared across workers: [tokens, prompt tokens, requests] each
        self.serial = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        env, path = self._route(scope["path"])
        if scope["method"] == "GET":
            status, body = self._get(path)
        else:
            chunks = []
            while True:
                message = await receive()
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            status, body = self._post(env, path, b"".join(chunks))
        streamed = status == 200 and body.startswith(b"data: ")
        kind = b"text/plain" if path == "/metrics" else b"text/event-stream" if streamed else b"application/json"
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _route(self, path: str) -> tuple[str, str]:
        """(env, path without the env prefix): `/wordle/v1/completions` -> ("wordle", "/v1/completions")."""
        head, _, rest = path.lstrip("/").partition("/")
        return (head, "/" + rest) if head in self.books else (self.default_env, path)

    def _get(self, path: str) -> tuple[int, bytes]:
        if path == "/health":
            return 200, b""
        if path == "/v1/models":
            return 200, self.encode({"object": "list", "data": [{"id": self.model, "object": "model",
                                                                 "owned_by": "hubgym", "max_model_len": 1 << 20}]})
        if path == "/metrics":
            return 200, self._metrics().encode()
        return 404, self.encode({"error": {"message": f"no route {path}", "code": 404}})

    def _post(self, env: str, path: str, raw: bytes) -> tuple[int, bytes]:
        try:
            body = self.decode(raw)
            if path == "/v1/completions":
                return 200, self.encode(self.completions(env, body))
            if path == "/v1/chat/completions":
                answer = self.chat(env, body)
                return 200, self.stream(answer, body) if body.get("stream") else self.encode(answer)
        except Exception as exc:  # a malformed request: vLLM answers 400 with the reason
            return 400, self.encode({"error": {"message": f"{type(exc).__name__}: {exc}", "type": "BadRequestError",
                                               "code": 400}})
        return 404, self.encode({"error": {"message": f"no route {path}", "code": 404}})

    # ---- completions (token-in) -------------------------------------------------------------------------

    def completions(self, env: str, body: dict) -> dict:
        ids = body["prompt"]
        if not ids or not isinstance(ids[0], int):
            raise ValueError("the instant server takes token ids as the prompt (a list of ints)")
        turn, last = self._turn_and_last(ids)
        reply, finish = self._cut(self.books[env].pick(turn, last), body.get("max_tokens"))
        n = body.get("n") or 1
        want_ids = bool(body.get("return_token_ids"))
        logprobs = None if body.get("logprobs") is None else {
            "text_offset": None, "token_logprobs": reply.logprobs, "tokens": reply.tokens,
            "top_logprobs": [{t: lp} for t, lp in zip(reply.tokens, reply.logprobs)]}
        choices = [{"index": i, "text": reply.text, "logprobs": logprobs, "finish_reason": finish,
                    "stop_reason": None, "prompt_logprobs": None,
                    "prompt_token_ids": ids if want_ids else None, "token_ids": reply.ids if want_ids else None}
                   for i in range(n)]
        self._count(len(reply.ids) * n, len(ids))
        return {"id": self._id("cmpl"), "object": "text_completion", "created": int(time.time()),
                "model": body.get("model", self.model), "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(reply.ids) * n,
                          "total_tokens": len(ids) + len(reply.ids) * n}}

    def _turn_and_last(self, ids: list[int]) -> tuple[int, str]:
        """The assistant turn asked for (assistant headers before the generation prompt) and the content of the
        message before it, read from the rendered ids (ChatML: `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`)."""
        starts = [i for i, t in enumerate(ids) if t == self.im_start]
        width = len(self.assistant)
        headers = [i for i in starts if ids[i + 1:i + 1 + width] == self.assistant]
        turn = max(len(headers) - 1, 0)
        last_start = [i for i in starts if i < (headers[-1] if headers else len(ids))]
        if not last_start:
            return turn, ""
        block = self.backend.decode(ids[last_start[-1] + 1:headers[-1] if headers else len(ids)],
                                    skip_special_tokens=False)
        return turn, block.partition("\n")[2].removesuffix("\n").removesuffix("<|im_end|>")

    # ---- chat completions --------------------------------------------------------------------------------

    def chat(self, env: str, body: dict) -> dict:
        messages = body["messages"]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        last = next((_text(m.get("content")) for m in reversed(messages) if m.get("role") != "assistant"), "")
        reply, finish = self._cut(self.books[env].pick(turn, last), body.get("max_tokens"))
        prompt_ids = (body.get("kv_transfer_params") or {}).get("prompt_token_ids") or self._render(body)
        calls = [{"id": f"chatcmpl-tool-{self._id('')[1:]}", "type": "function", "function": call}
                 for call in (reply.tool_calls if body.get("tools") and finish == "stop" else [])]
        content = reply.content if calls else reply.text
        logprobs = {"content": [{"token": t, "logprob": lp, "bytes": None, "top_logprobs": []}
                                for t, lp in zip(reply.tokens, reply.logprobs)]} if body.get("logprobs") else None
        want_ids, n = bool(body.get("return_token_ids")), body.get("n") or 1
        choices = [{"index": i, "message": {"role": "assistant", "content": content, "refusal": None,
                                            "tool_calls": calls, "reasoning_content": None},
                    "logprobs": logprobs, "finish_reason": "tool_calls" if calls else finish, "stop_reason": None,
                    "token_ids": reply.ids if want_ids else None} for i in range(n)]
        self._count(len(reply.ids) * n, len(prompt_ids))
        return {"id": self._id("chatcmpl"), "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", self.model), "choices": choices,
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(reply.ids) * n,
                          "total_tokens": len(prompt_ids) + len(reply.ids) * n},
                "prompt_logprobs": None, "prompt_token_ids": prompt_ids if want_ids else None}

    def stream(self, answer: dict, body: dict) -> bytes:
        """A chat answer as vLLM streams it (server-sent events): per choice one delta with the whole reply (role,
        content, tool calls with their index, logprobs, token ids), then one with the finish reason; the usage
        when `stream_options.include_usage` asks for it; then `[DONE]`."""
        head = {k: answer[k] for k in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
        events = []
        for choice in answer["choices"]:
            message = choice["message"]
            calls = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
            delta = {"role": "assistant", "content": message["content"]} | ({"tool_calls": calls} if calls else {})
            events.append(head | {"choices": [{"index": choice["index"], "delta": delta, "logprobs": choice["logprobs"],
                                               "finish_reason": None, "token_ids": choice["token_ids"]}],
                                  "prompt_token_ids": answer["prompt_token_ids"]})
            events.append(head | {"choices": [{"index": choice["index"], "delta": {}, "logprobs": None,
                                               "finish_reason": choice["finish_reason"]}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append(head | {"choices": [], "usage": answer["usage"]})
        return b"".join(b"data: " + self.encode(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"

    def _render(self, body: dict) -> list[int]:
        """The prompt as vLLM renders it: the chat template over the messages (tool-call arguments parsed into
        objects, as vLLM hands them to templates), with the tools, plus the generation prompt; then tokenized."""
        import json

        messages = []
        for m in body["messages"]:
            calls = m.get("tool_calls")
            if calls:
                m = {**m, "tool_calls": [{**c, "function": {**c["function"],
                                                            "arguments": json.loads(c["function"]["arguments"])}}
                                         for c in calls]}
            messages.append({**m, "content": _text(m.get("content"))} if isinstance(m.get("content"), list) else m)
        text = self.template.render(messages=messages, tools=body.get("tools"), add_generation_prompt=True,
                                    **self.tokenizer.special_tokens_map)
        return self.backend.encode(text, add_special_tokens=False).ids

    # ---- shared ------------------------------------------------------------------------------------------

    @staticmethod
    def _cut(reply: Reply, max_tokens: int | None) -> tuple[Reply, str]:
        """The reply cut to max_tokens (finish "length", as a sampler stops), else whole (finish "stop")."""
        if not max_tokens or len(reply.ids) <= max_tokens:
            return reply, "stop"
        k = max_tokens
        return Reply("", reply.ids[:k], reply.logprobs[:k], reply.tokens[:k], "", []), "length"

    def _id(self, prefix: str) -> str:
        self.serial += 1
        return f"{prefix}-{os.getpid():x}{self.serial:010x}"

    def _count(self, generated: int, prompt: int) -> None:
        if self.counters is not None:
            base = 3 * self.slot
            self.counters[base] += generated
            self.counters[base + 1] += prompt
            self.counters[base + 2] += 1

    def _metrics(self) -> str:
        values = [0.0, 0.0, 0.0]
        if self.counters is not None:
            for i, v in enumerate(self.counters):
                values[i % 3] += v
        labels = ['{model_name="instant"}', '{model_name="instant"}',
                  '{handler="/v1/completions",method="POST",status="2xx"}']
        return "".join(f"{name}{label} {value}\n" for name, label, value in zip(COUNTERS, labels, values))


def _text(content: Any) -> str:
    """A message's content as text (OpenAI content parts joined)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _serve(sock: socket.socket, model: str, env: str, counters: Any, slot: int) -> None:
    """One worker: uvicorn (uvloop + httptools) on the shared listening socket."""
    import uvicorn

    app = InstantApp(model, env, counters, slot)
    config = uvicorn.Config(app, loop="uvloop", http="httptools", lifespan="on", log_level="warning",
                            access_log=False, timeout_keep_alive=600, backlog=4096)
    uvicorn.Server(config).run(sockets=[sock])


def serve(model: str, *, host: str = "127.0.0.1", port: int = 8100, workers: int = 1, env: str = "calc_tools") -> None:
    """Listen on host:port with `workers` forked processes sharing one socket; returns when they all end."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.set_inheritable(True)
    context = multiprocessing.get_context("fork")
    counters = context.RawArray("d", 3 * workers)
    procs = [context.Process(target=_serve, args=(sock, model, env, counters, i), daemon=True) for i in range(workers)]
    for p in procs:
        p.start()
    signal.signal(signal.SIGTERM, lambda *_: [p.terminate() for p in procs])
    for p in procs:
        p.join()


class InstantServer:
    """The instant server as a subprocess; a context manager. `url(env)`: the base_url answering with that env's
    replies; `cpu_s()`: CPU seconds its processes used so far (user + system, all workers)."""

    def __init__(self, model: str | Path, *, workers: int = 1, env: str = "calc_tools", port: int | None = None,
                 log_path: str | Path | None = None, startup_timeout_s: float = 60.0):
        self.model, self.workers, self.env, self.port = str(model), workers, env, port or free_port()
        self.log_path, self.startup_timeout_s = log_path, startup_timeout_s
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: Any = None

    def url(self, env: str) -> str:
        return f"http://127.0.0.1:{self.port}/{env.split(':')[0]}/v1"

    def __enter__(self) -> InstantServer:
        import subprocess
        import sys

        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "hubgym.rollout.instant_server", self.model,
                                      "--port", str(self.port), "--workers", str(self.workers), "--env", self.env],
                                     stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise EngineError(f"the instant server did not start on port {self.port} "
                                  f"(exit code {self.proc.returncode}); see {self.log_path or 'its output'}")
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False

    def cpu_s(self) -> float:
        import psutil

        procs = [psutil.Process(self.proc.pid)]
        procs += procs[0].children(recursive=True)
        return sum(t.user + t.system + t.children_user + t.children_system for t in (p.cpu_times() for p in procs))

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="model folder: its tokenizer and chat template make the replies and prompts")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the listening socket")
    parser.add_argument("--env", default="calc_tools", choices=ENVS, help="replies for routes without an env prefix")
    args = parser.parse_args(argv)
    serve(args.model, host=args.host, port=args.port, workers=args.workers, env=args.env)


if __name__ == "__main__":
    main()
