"""hubgym vs verifiers: the same tool_use and multi_turn rollouts against ONE server, side by side.

    python bench/bench_verifiers.py --verifiers-python VENV/bin/python [--tasks 16 --n 4 --concurrency 2,8]
    python bench/bench_verifiers.py --verifiers-python VENV/bin/python --server instant --concurrency 16,64,256

`--server vllm` (default) serves the tiny model with vLLM: on a CPU machine vLLM bounds both sides.
`--server instant` (`hubgym.rollout.instant_server`) answers every request at once with a valid
pre-generated reply (the same trajectory for both frameworks), so the clients are the bottleneck:
that mode reports client CPU per rollout and the server's own CPU, and takes its tasks from the
train split, `--tasks-per-group` x groups in flight per run (capped by the split), so the in-flight
count is reached and held.

VENV is a separate virtualenv with `pip install verifiers==0.3.1` (the last release whose top-level
API is Environment / MultiTurnEnv / ToolEnv; 0.4 moved to a new stack) plus hubgym's light
dependencies (no torch, no vLLM); this repository goes on its PYTHONPATH so both sides run the same
env logic. One process per framework: this one runs hubgym (`run_rollouts`, engine `openai`); a
long-lived worker in VENV runs verifiers (`env.generate`). Runs alternate, hubgym then verifiers,
`--repeats` times per env after one warm-up each; the table shows medians.

What is the same on both sides: the server and model, the task prompts (hubgym's rows, with the
multi_turn reset observation), the tool schema and the tool code (hubgym's calculator), the env
transition and the reward code (hubgym's verifier modules, called from a verifiers Rubric and
MultiTurnEnv), groups of `--n` rollouts, `--concurrency` groups in flight, max_tokens, temperature
1.0, logprobs + `return_token_ids` on every request, and a vLLM structured-outputs regex that makes
the random-weight model answer, call the calculator or play a move (so turns and tool calls happen).

What differs is each framework's own machinery, which is what is measured: hubgym sends one request
with n samples for a group's first turn and writes Arrow shards; in `tokens` mode it sends token ids
to /v1/completions and parses tool calls itself; verifiers sends one chat request per rollout and
turn (its token-in client needs a custom vLLM route) and keeps results in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CALL = (r'<tool_call>\n\{"name": "calculator", "arguments": \{"expression": "[1-9][0-9]{0,3} \* [1-9][0-9]{0,3}"\}\}'
        r'\n</tool_call>')
ENVS = {  # env spec -> the regex every reply must match (vLLM structured outputs)
    "calc_tools:calculator": r"<answer>[0-9]{1,7}</answer>|" + CALL,
    "wordle": r"<guess>[a-z]{5}</guess>",
    "tictactoe": r"<move>[abc][123]</move>",
}


# ---------------------------------------------------------------- hubgym side (this process)

def export_tasks(spec: str, limit: int, split: str = "test") -> list[dict[str, Any]]:
    """hubgym's task rows, plus what verifiers needs: the opening messages (with the multi_turn
    observation) in OpenAI form and the tool schemas."""
    from hubgym.envs import open_env
    from hubgym.schemas.messages import to_openai, user
    from hubgym.tools.registry import make_toolbox

    env = open_env(spec)
    env.take(split, limit)
    rows = []
    for task in env.tasks:
        spec_ = task["interaction"]
        prompt = list(task["prompt"])
        if spec_["kind"] == "multi_turn":
            _, observation = env.verifier.reset(task)
            prompt += [user(observation)] if observation else []
        tools = make_toolbox(spec_["tools"], task).schemas() if spec_["tools"] else []
        rows.append({"task": dict(task), "messages": [to_openai(m) for m in prompt], "tools": tools,
                     "verifier": env.verifier.name})
    return rows


def run_hubgym(spec: str, mode: str, concurrency: int, seed: int, args: argparse.Namespace, base_url: str,
               model: str, out: Path, tasks: int) -> dict:
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts

    config = RolloutConfig(envs=[spec], model=model, out=str(out), engine="openai", base_url=base_url, mode=mode,
                           n=args.n, limit=tasks, split=args.split,
                           sampling=SamplingArgs(max_tokens=args.max_tokens, seed=seed),
                           max_model_len=args.max_model_len, concurrency=concurrency)
    engine = clocked_engine(model, base_url, mode=mode, max_model_len=args.max_model_len,
                            extra_body={"structured_outputs": {"regex": ENVS[spec]}})
    summary = run_rollouts(config, engine=engine, progress=False)  # its clock starts after the tasks are built
    cpu = time.process_time() - engine.cpu_at_first_request
    rewards, turns = _hubgym_stats(out)
    return {"rollouts": summary.written, "seconds": summary.seconds, "cpu_s": cpu, "reward_mean": rewards,
            "turns_mean": turns}


def clocked_engine(*args: Any, **kwargs: Any) -> Any:
    """hubgym's OpenAIEngine that notes the process's CPU time at its first request: a run's client CPU is counted
    from there (as verifiers' is around `env.generate`), not over building the task rows and the tokenizer."""
    from hubgym.engines import OpenAIEngine

    class CPUClockedEngine(OpenAIEngine):
        cpu_at_first_request: float | None = None

        async def generate(self, request, sampling):
            if self.cpu_at_first_request is None:
                self.cpu_at_first_request = time.process_time()
            return await super().generate(request, sampling)

    return CPUClockedEngine(*args, **kwargs)


def _hubgym_stats(out: Path) -> tuple[float, float]:
    import pyarrow as pa
    import pyarrow.compute as pc

    table = pa.concat_tables([pa.ipc.open_file(str(p)).read_all() for p in sorted((out / "shards").glob("*.arrow"))])
    return pc.mean(table["reward"]).as_py(), pc.mean(table["num_turns"]).as_py()


def server_counters(base_url: str) -> dict[str, float]:
    """The server's own counters (Prometheus /metrics): generated tokens, prompt tokens, HTTP generation
    requests. Both frameworks are measured by the same meter, before and after each run."""
    import urllib.request

    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as response:
        text = response.read().decode()
    counters = {"tokens": 0.0, "prompt_tokens": 0.0, "requests": 0.0}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("vllm:generation_tokens_total"):
            counters["tokens"] += float(value)
        elif name.startswith("vllm:prompt_tokens_total"):
            counters["prompt_tokens"] += float(value)
        elif name.startswith("http_requests_total") and "completions" in name and 'method="POST"' in name:
            counters["requests"] += float(value)
    return counters


def measured(base_url: str, run: Any, server: Any = None) -> dict:
    """Run one side's rollouts and add what the server saw meanwhile (and, for the instant server, the CPU
    seconds its processes used)."""
    before, cpu = server_counters(base_url), server.cpu_s() if server is not None else 0.0
    result = run()
    after = server_counters(base_url)
    server_cpu = server.cpu_s() - cpu if server is not None else float("nan")
    return {**result, **{k: after[k] - before[k] for k in after}, "server_cpu_s": server_cpu}


class VerifiersWorker:
    """The verifiers side: a process in the verifiers venv, one JSON request/response per line."""

    def __init__(self, python: str, tasks_file: Path, base_url: str, model: str):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen([python, __file__, "--worker", str(tasks_file), base_url, model], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.version = self._read()["verifiers"]

    def run(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the verifiers worker exited with code {self.proc.wait()}")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main(args: argparse.Namespace) -> None:
    from hubgym.models.tiny import make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="bench-verifiers-"))
    print(f"work folder (model, tasks, server log, hubgym shards): {work}", file=sys.stderr)
    model = str(make_tiny_model(work / "tiny-model"))
    tasks_file = work / "tasks.json"
    most = max(tasks_per_run(args, c) for c in args.concurrency)
    tasks_file.write_text(json.dumps({spec: export_tasks(spec, most, args.split) for spec in args.envs}, default=str))
    results: dict[tuple[str, int, str], list[dict]] = {}
    with open_server(args, model, work) as server:
        worker = VerifiersWorker(args.verifiers_python, tasks_file, server.base_url, model)
        try:
            for spec in args.envs:
                for concurrency in args.concurrency:
                    run_side_by_side(spec, concurrency, args, server, model, worker, work, results)
        finally:
            worker.close()
    report(results, args, worker.version)


def open_server(args: argparse.Namespace, model: str, work: Path) -> Any:
    """The server both frameworks talk to: vLLM with the tiny model, or the instant server."""
    if args.server == "instant":
        from hubgym.rollout.instant_server import InstantServer

        return InstantServer(model, workers=args.server_workers, log_path=work / "instant.log")
    from hubgym.engines.server import VLLMServer

    return VLLMServer(model, max_model_len=args.max_model_len, tool_parser="hermes", log_path=work / "vllm.log")


def tasks_per_run(args: argparse.Namespace, concurrency: int) -> int:
    """--tasks, or with --tasks-per-group: that many tasks per group in flight (the split may have fewer)."""
    return args.tasks_per_group * concurrency if args.tasks_per_group else args.tasks


def base_url_for(server: Any, spec: str) -> str:
    """The instant server answers each env's requests under its own prefix (its replies are that env's)."""
    return server.url(spec) if hasattr(server, "url") else server.base_url


def run_side_by_side(spec: str, concurrency: int, args: argparse.Namespace, server: Any, model: str,
                     worker: VerifiersWorker, work: Path, results: dict) -> None:
    """Alternate the runners on one workload; the first `--warmup` repeats warm each up and are not kept."""
    base_url, tasks = base_url_for(server, spec), tasks_per_run(args, concurrency)
    metered = server if args.server == "instant" else None
    request = {"env": spec, "n": args.n, "concurrency": concurrency, "max_tokens": args.max_tokens,
               "regex": ENVS[spec], "tasks": tasks, "base_url": base_url}
    for repeat in range(args.repeats + args.warmup):
        kept = repeat >= args.warmup
        for mode in args.modes:
            out = work / f"hubgym-{spec.replace(':', '-')}-c{concurrency}-{mode}-{repeat}"
            # a new seed per repeat: hubgym's seeded samples vary across runs as verifiers' unseeded ones do
            run = lambda: run_hubgym(spec, mode, concurrency, repeat, args, base_url, model, out, tasks)  # noqa: E731
            _keep(results, (spec, concurrency, f"hubgym/{mode}"), kept, measured(base_url, run, metered))
        _keep(results, (spec, concurrency, "verifiers"), kept, measured(base_url, lambda: worker.run(request), metered))


def _keep(results: dict, key: tuple[str, int, str], kept: bool, result: dict) -> None:
    spec, concurrency, who = key
    print(f"{spec:22} c={concurrency:<3} {who:18} {'run' if kept else 'warm-up'}: {result['rollouts']} rollouts, "
          f"{result['tokens']:.0f} tokens, {result['requests']:.0f} requests, {result['seconds']:.2f} s, "
          f"client cpu {result['cpu_s']:.2f} s, server cpu {result['server_cpu_s']:.2f} s, "
          f"reward {result['reward_mean']:.3f}, turns {result['turns_mean']:.2f}", file=sys.stderr)
    if kept:
        results.setdefault(key, []).append(result)


def report(results: dict, args: argparse.Namespace, verifiers_version: str) -> None:
    if args.server == "instant":
        return report_client_bound(results, args, verifiers_version)
    report_server_bound(results, args, verifiers_version)


def report_client_bound(results: dict, args: argparse.Namespace, verifiers_version: str) -> None:
    """Markdown rows for the instant server: medians of rollouts/s and of client CPU per rollout, ratios to
    verifiers, and the share of the wall time the client and the server were on a CPU."""
    def median(runs: list[dict], value: Any) -> float:
        return statistics.median(value(r) for r in runs)

    print(f"\nverifiers {verifiers_version}; instant server ({args.server_workers} process); n {args.n}; "
          f"{args.split} split, {args.tasks_per_group or args.tasks} tasks per group in flight (capped by the split); "
          f"{args.repeats} runs per runner after {args.warmup} warm-up (medians)\n")
    print("| env | groups in flight | rollouts / run | runner | rollouts/s | vs verifiers | client CPU ms / rollout "
          "| vs verifiers | client CPU / wall | server CPU / wall | requests / rollout | mean turns |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.envs:
        for concurrency in args.concurrency:
            base = results[(spec, concurrency, "verifiers")]
            base_rps = median(base, lambda r: r["rollouts"] / r["seconds"])
            base_cpu = median(base, lambda r: r["cpu_s"] / r["rollouts"])
            for who in [f"hubgym/{m}" for m in args.modes] + ["verifiers"]:
                runs = results[(spec, concurrency, who)]
                rps = median(runs, lambda r: r["rollouts"] / r["seconds"])
                cpu = median(runs, lambda r: r["cpu_s"] / r["rollouts"])
                print(f"| {spec} | {concurrency} | {runs[0]['rollouts']} | {who} | {rps:.0f} | {rps / base_rps:.2f}x | "
                      f"{cpu * 1000:.1f} | {cpu / base_cpu:.2f}x | "
                      f"{median(runs, lambda r: r['cpu_s'] / r['seconds']):.0%} | "
                      f"{median(runs, lambda r: r['server_cpu_s'] / r['seconds']):.0%} | "
                      f"{sum(r['requests'] for r in runs) / sum(r['rollouts'] for r in runs):.2f} | "
                      f"{statistics.mean(r['turns_mean'] for r in runs):.2f} |")


def report_server_bound(results: dict, args: argparse.Namespace, verifiers_version: str) -> None:
    """Markdown rows: medians of rollouts/s and generated tokens/s, and hubgym / verifiers ratios."""
    def rate(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] / r["seconds"] for r in runs)

    def mean(runs: list[dict], key: str) -> float:
        return statistics.mean(r[key] for r in runs)

    print(f"\nverifiers {verifiers_version}; {args.tasks} tasks x n {args.n} = {args.tasks * args.n} rollouts per run, "
          f"max_tokens {args.max_tokens}, temperature 1.0, {args.repeats} runs per runner (medians)\n")
    print("| env (kind) | groups in flight | runner | rollouts/s | gen tokens/s | rollouts/s vs verifiers "
          "| tokens/s vs verifiers | requests / rollout | mean turns | mean reward | client CPU / wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.envs:
        kind = "tool_use" if spec.startswith("calc_tools") else "multi_turn"
        for concurrency in args.concurrency:
            base = results[(spec, concurrency, "verifiers")]
            for who in [f"hubgym/{m}" for m in args.modes] + ["verifiers"]:
                runs = results[(spec, concurrency, who)]
                rps, tps = rate(runs, "rollouts"), rate(runs, "tokens")
                print(f"| {spec} ({kind}) | {concurrency} | {who} | {rps:.1f} | {tps:,.0f} | "
                      f"{rps / rate(base, 'rollouts'):.2f}x | {tps / rate(base, 'tokens'):.2f}x | "
                      f"{sum(r['requests'] for r in runs) / sum(r['rollouts'] for r in runs):.2f} | "
                      f"{mean(runs, 'turns_mean'):.2f} | {mean(runs, 'reward_mean'):.3f} | "
                      f"{sum(r['cpu_s'] for r in runs) / sum(r['seconds'] for r in runs):.0%} |")


# ---------------------------------------------------------------- verifiers side (worker process)

def worker(tasks_file: str, base_url: str, model: str) -> None:
    """Serve run requests from stdin; each builds (once) a verifiers env and times `env.generate`."""
    import asyncio

    import verifiers as vf

    replies = os.fdopen(os.dup(1), "w")  # the protocol channel; anything else printed goes to stderr
    os.dup2(2, 1)
    all_tasks = json.loads(Path(tasks_file).read_text())
    envs: dict[str, Any] = {}
    print(json.dumps({"verifiers": vf.__version__}), file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        rows = all_tasks[request["env"]]
        env = envs.get(request["env"]) or envs.setdefault(request["env"], make_verifiers_env(rows))
        result = asyncio.run(_generate(env, rows[:request.get("tasks", len(rows))], request,
                                       request.get("base_url", base_url), model))
        print(json.dumps(result), file=replies, flush=True)


async def _generate(env: Any, rows: list[dict], request: dict, base_url: str, model: str) -> dict:
    import openai
    from verifiers.clients import OpenAIChatCompletionsClient

    inputs = [{"example_id": i, "prompt": row["messages"], "answer": "", "info": {"index": i}}
              for i, row in enumerate(rows) for _ in range(request["n"])]
    sampling = {"max_tokens": request["max_tokens"], "temperature": 1.0, "top_p": 1.0, "logprobs": True,
                "extra_body": {"return_token_ids": True, "structured_outputs": {"regex": request["regex"]}}}
    client = OpenAIChatCompletionsClient(openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=4))
    started, cpu = time.perf_counter(), time.process_time()
    outputs = await env.generate(inputs, client=client, model=model, sampling_args=sampling,
                                 max_concurrent=request["concurrency"], on_start=lambda *a: None,
                                 on_progress=lambda *a: None)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    await client.close()
    states = outputs["outputs"]
    errors = [s.get("error") for s in states if s.get("error")]
    if errors:
        raise RuntimeError(f"verifiers rollouts failed: {errors[:3]}")
    return {"rollouts": len(states), "seconds": seconds, "cpu_s": cpu,
            "reward_mean": statistics.mean(s["reward"] for s in states),
            "turns_mean": statistics.mean(s["metrics"]["num_turns"] for s in states)}


def make_verifiers_env(rows: list[dict]) -> Any:
    """A verifiers ToolEnv (tool_use) or MultiTurnEnv (multi_turn) over hubgym's rows and code."""
    import verifiers as vf
    from datasets import Dataset

    from hubgym.tools.registry import get_tool
    from hubgym.verifiers.contract import load_verifier

    verifier = load_verifier(rows[0]["verifier"])
    tasks = [row["task"] for row in rows]
    dataset = Dataset.from_list([{"prompt": row["messages"], "answer": "", "info": {"index": i}}
                                 for i, row in enumerate(rows)])

    def hubgym_reward(completion, info) -> float:
        """hubgym's own verifier on the same trajectory: both frameworks score with the same code."""
        score = verifier.score(tasks[info["index"]], _to_hubgym(completion))
        return score.reward if score.reward is not None else 0.0

    rubric = vf.Rubric(funcs=[hubgym_reward], weights=[1.0])
    spec = tasks[0]["interaction"]
    if spec["kind"] == "tool_use":
        calculator = get_tool("calculator").fn

        def calc(expression: str) -> str:
            """Evaluate an arithmetic expression."""
            return calculator(expression)

        calc.__name__ = "calculator"
        env = vf.ToolEnv(tools=[calc], max_turns=spec["max_turns"], eval_dataset=dataset, rubric=rubric,
                         error_formatter=lambda e: f"Error: {type(e).__name__}: {e}")
        env.tool_defs = env._normalize_tool_defs([t["function"] for t in rows[0]["tools"]])  # hubgym's exact schema
        return env
    return _mdp_env_class(vf)(verifier, tasks, max_turns=spec["max_turns"], eval_dataset=dataset, rubric=rubric)


def _mdp_env_class(vf: Any) -> type:
    class HubgymMDPEnv(vf.MultiTurnEnv):
        """The env's `reset`/`step` (hubgym's verifier module) behind verifiers' MultiTurnEnv."""

        def __init__(self, verifier: Any, tasks: list[dict], **kwargs: Any):
            super().__init__(**kwargs)
            self.mdp, self.mdp_tasks = verifier, tasks

        async def setup_state(self, state):
            state["mdp_state"], _ = self.mdp.reset(self.mdp_tasks[state["info"]["index"]])
            return state

        async def env_response(self, messages, state, **kwargs):
            task = self.mdp_tasks[state["info"]["index"]]
            action = messages[-1].content or ""
            state["mdp_state"], observation, _reward, done = self.mdp.step(task, state["mdp_state"], action)
            reply = [vf.UserMessage(role="user", content=observation)]
            if done:
                state["final_env_response"] = reply
            return reply

    return HubgymMDPEnv


def _to_hubgym(completion: list[Any]) -> list[dict]:
    """verifiers' messages as hubgym Messages (tool results get their tool's name from the call)."""
    from hubgym.schemas.messages import message as make, tool_call

    out, names = [], {}
    for m in completion:
        calls = [tool_call(c.id, c.name, c.arguments) for c in (getattr(m, "tool_calls", None) or [])]
        names.update({c["id"]: c["name"] for c in calls})
        call_id = getattr(m, "tool_call_id", None)
        content = m.content if isinstance(m.content, str) or m.content is None else str(m.content)
        out.append(make(m.role, content, tool_calls=calls or None, tool_call_id=call_id, name=names.get(call_id)))
    return out


def _names(value: str) -> list[str]:
    return [v for v in value.split(",") if v]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--verifiers-python", required=True, help="python of the venv where verifiers is installed")
    parser.add_argument("--envs", type=_names, default=list(ENVS), help=f"comma-separated, from {list(ENVS)}")
    parser.add_argument("--modes", type=_names, default=["tokens", "chat"], help="hubgym OpenAIEngine modes to run")
    parser.add_argument("--tasks", type=int, default=16, help="tasks per env")
    parser.add_argument("--n", type=int, default=4, help="rollouts per task (one group)")
    parser.add_argument("--concurrency", type=lambda v: [int(c) for c in v.split(",")], default=[2, 8],
                        help="groups in flight (both frameworks), comma-separated: one workload each")
    parser.add_argument("--max-tokens", type=int, default=64, help="per turn")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per runner, after the warm-up")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per runner and workload, first")
    parser.add_argument("--server", choices=["vllm", "instant"], default="vllm",
                        help="vllm: the tiny model served by vLLM; instant: pre-generated replies at once")
    parser.add_argument("--server-workers", type=int, default=1, help="instant server processes")
    parser.add_argument("--split", default="test", help="the tasks' split (instant runs want train: more rows)")
    parser.add_argument("--tasks-per-group", type=int, default=0,
                        help="tasks per run = this x groups in flight (capped by the split); 0: --tasks")
    return parser.parse_args(argv)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        main(parse_args(sys.argv[1:]))
