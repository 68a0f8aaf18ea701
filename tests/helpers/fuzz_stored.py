"""Fuzz hubgym's readers of stored data with crafted files whose recorded sha256 still matches.

    python tests/helpers/fuzz_stored.py --mutants 10000 --seed 1 --corpus /tmp/fuzz-corpus   # the run in RESULTS.md
    python tests/helpers/fuzz_stored.py --values --mutants 10000 --seed 2 --corpus /tmp/fuzz-corpus  # values only
    python tests/helpers/fuzz_stored.py --seed 1 --only 4711 --save /tmp/mutant              # one mutant, to look at

The corpus is real: two rollout runs of the tiny model (wordle, multi_turn; calc_tools, tool_use) sampled
through the instant server, so their token ids pass the token audit; both pushed to a local hub as one rollout
repo (index.json, summary.json, a card), beside the wordle env pushed as an env repo (hubgym.json, a card, its
verifier). Mutant i is drawn from Random(f"{seed}:{i}"): a file (a shard, local or on the hub; a run manifest;
index.json; summary.json; a card; hubgym.json; the verifier) and a mutation of it (fuzz_mutations.py). A mutated
shard's sha256 is written into the manifest or index.json that records it, so the integrity check passes. With
`--values` every mutant is a value mutation of a shard, local or on the hub (fuzz_values.py).

Each mutant runs the commands that read its file, in-process, in a child process that goes on to the next
mutant: `hubgym report`, `score` and `replay --model` on the run folders; `score` and `replay` of the hub repo;
`score --env-revision` pinned to the env repo. The outcome is the worst of its commands':

    clean error      exit code 1 with one `error:` line (or replay's divergence table)
    valid success    exit code 0 on data the oracle (fuzz_mutations.py) calls valid
    silent success   exit code 0 on data the oracle calls invalid
    traceback        an exception that is not hubgym's one-line error
    signal           the child died of a signal (a crash in native code); the next child goes on after it (a
                     SIGTERM or SIGKILL, which another process sends, gets the mutant one more run first)
    hang             no answer within --timeout seconds
    fuzzer error     the child died while making the mutant (the fuzzer's own fault, not hubgym's)

The exit code is 1 when any mutant is anything but a clean error or a valid success. `--out` gets outcomes.jsonl
(every mutant) and summary.json (the counts).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: `helpers` is a package when run as a script
from helpers.fuzz_mutations import (  # noqa: E402
    index_problem, json_problem, mutate_bytes, mutate_json, mutate_shard, run_manifest_problem, shard_problem,
)

OUTCOMES = ("clean error", "valid success", "silent success", "traceback", "signal", "hang", "fuzzer error")
BAD = ("silent success", "traceback", "signal", "hang", "fuzzer error")
KILLED = (-signal.SIGTERM, -signal.SIGKILL)  # what another process sends; no crash of the child's own ends so
RUNS = ("wordle", "calc_tools")
REPO, ENV_REPO, WORKER = "org/rollouts", "org/wordle", "w000of001"
TARGETS = {"shard": 40, "hub shard": 12, "run manifest": 12, "index.json": 12, "summary.json": 3,
           "rollouts card": 3, "hubgym.json": 12, "env card": 3, "verifier.py": 3}
"""File kinds and how often each is drawn."""
VALUE_TARGETS = {"shard": 40, "hub shard": 12}
"""With --values: shards only, every mutation a value mutation."""
_VALUES = False  # set by --values (and handed to the child processes)


def values_only(on: bool) -> None:
    """Every mutant a value mutation of a shard (the `--values` run)."""
    global _VALUES
    _VALUES = on


# -- the corpus ---------------------------------------------------------------------------------------------


def build_corpus(root: Path) -> dict[str, Any]:
    """Real runs, a rollout repo and an env repo under `root` (kept: `--corpus` reuses them); their description."""
    described = root / "corpus.json"
    if described.exists():
        return json.loads(described.read_text())
    from hubgym.envs import push_env
    from hubgym.hub import LocalHub, push_rollouts
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from hubgym.rollout.instant_server import InstantServer
    from hubgym.models.tiny import make_tiny_model

    model = make_tiny_model(root / "model")
    with InstantServer(model, log_path=root / "server.log") as server:
        for env in RUNS:
            run_rollouts(RolloutConfig(envs=[env], model=server.model, out=str(root / "runs" / env), engine="openai",
                                       base_url=server.url(env), n=2, limit=2, split="train", max_model_len=2048,
                                       sampling=SamplingArgs(max_tokens=64), concurrency=2, max_rows_per_shard=2),
                         progress=False)
    hub = LocalHub(root / "hub")
    for env in RUNS:
        push_rollouts(root / "runs" / env, REPO, hub=hub, name=env)
    pushed = push_env("wordle", ENV_REPO, hub=hub, configs=["default"], overrides={"sizes": {"train": 2, "test": 2}})
    corpus = {"model": str(model), "pin": f"sha256:{pushed.manifest['verifier']['sha256']}"}
    described.write_text(json.dumps(corpus))
    return corpus


def commands(kind: str, work: Path, corpus: dict[str, Any]) -> list[list[str]]:
    """The hubgym commands that read a file of this kind, on the mutant's copy in `work`."""
    runs = [str(work / "runs" / env) for env in RUNS]
    hub = ["--hub", str(work / "hub")]
    if kind in ("shard", "run manifest"):
        return [["report", *runs, "--plot", str(work / "rewards.png")], ["score", *runs, "--workers", "1"],
                ["replay", *runs, "--model", corpus["model"]]]
    if kind in ("hubgym.json", "env card", "verifier.py"):
        return [["score", runs[0], "--env-revision", ENV_REPO, "--pin", f"{ENV_REPO}={corpus['pin']}", "--workers",
                 "1", *hub]]
    return [["score", REPO, "--workers", "1", *hub], ["replay", REPO, "--model", corpus["model"], *hub]]


# -- one mutant ---------------------------------------------------------------------------------------------


def draw(seed: int, index: int, root: Path) -> tuple[str, str, random.Random]:
    """(kind, file relative to the corpus, the mutant's generator)."""
    rng = random.Random(f"{seed}:{index}")
    targets = VALUE_TARGETS if _VALUES else TARGETS
    kind = rng.choices(list(targets), weights=list(targets.values()))[0]
    env_snapshot = _snapshot(root, ENV_REPO)
    repo_snapshot = _snapshot(root, REPO)
    run = rng.choice(RUNS)
    shards = sorted((root / "runs" / run / "shards").glob("*.arrow"))
    files = {"shard": lambda: rng.choice(shards),
             "run manifest": lambda: root / "runs" / run / f"manifest-{WORKER}.json",
             "hub shard": lambda: repo_snapshot / run / "shards" / rng.choice(shards).name,
             "index.json": lambda: repo_snapshot / run / "index.json",
             "summary.json": lambda: repo_snapshot / run / "summary.json",
             "rollouts card": lambda: repo_snapshot / "README.md", "hubgym.json": lambda: env_snapshot / "hubgym.json",
             "env card": lambda: env_snapshot / "README.md", "verifier.py": lambda: env_snapshot / "verifier.py"}
    return kind, str(files[kind]().relative_to(root)), rng


def _snapshot(root: Path, repo: str) -> Path:
    folder = root / "hub" / "datasets" / repo
    return folder / "snapshots" / (folder / "refs" / "main").read_text().strip()


def prepare(seed: int, index: int, root: Path, work: Path) -> dict[str, Any]:
    """Copy the corpus to `work` and apply mutant `index` there; what it is and whether its data is valid."""
    shutil.rmtree(work, ignore_errors=True)
    for folder in ("runs", "hub"):  # hard links: a mutated file is written as a new file (_replace)
        shutil.copytree(root / folder, work / folder, symlinks=True, copy_function=os.link)
    kind, name, rng = draw(seed, index, root)
    original = (root / name).read_bytes()
    if kind in ("shard", "hub shard"):
        mutation = mutate_shard(original, rng, values=_VALUES)
    else:
        mutation = (mutate_json if name.endswith(".json") else mutate_bytes)(original, rng)
    problem = _apply(kind, name, original, mutation, root, work)
    return {"index": index, "kind": kind, "file": name, "mutation": mutation.name, "invalid": problem}


def _apply(kind: str, name: str, original: bytes, mutation, root: Path, work: Path) -> str | None:
    """Write the mutation into `work` (recording a shard's new sha256 where its run records it); the oracle's
    verdict: why the data read is invalid, or None."""
    import hashlib

    from hubgym.hub import LocalHub

    path = Path(name)
    new_sha = hashlib.sha256(mutation.data).hexdigest()
    if kind == "shard":
        run = path.parent.parent
        _replace(work / path, mutation.data)
        manifest = work / run / f"manifest-{WORKER}.json"
        record = json.loads(manifest.read_text())
        entry = record["shard_files"][path.name]
        rows = _rows(mutation.data) if mutation.crafted else entry["rows"]
        entry.update(sha256=new_sha, rows=rows)
        _replace(manifest, json.dumps(record, indent=2).encode())
        return _run_problem(work / run, record["shard_files"], record["run_id"])
    if kind == "run manifest":
        _replace(work / path, mutation.data)
        return run_manifest_problem(mutation.data, original, json.loads(original)["run_id"])
    repo = REPO if "rollouts" in name else ENV_REPO
    in_repo = Path(*path.parts[6:])  # hub/datasets/org/name/snapshots/<id>/...
    files = {str(in_repo): mutation.data}
    problem = None
    if kind == "hub shard":
        index_path = in_repo.parent.parent / "index.json"
        index = json.loads((root / path).parent.parent.joinpath("index.json").read_text())
        entry = index["shards"][in_repo.name]
        entry.update(sha256=new_sha, rows=_rows(mutation.data) if mutation.crafted else entry["rows"])
        files[str(index_path)] = json.dumps(index).encode()
        shards = {f: (root / path).parent.joinpath(f).read_bytes() for f in index["shards"]}
        shards[in_repo.name] = mutation.data
        pushed = json.loads((root / path).parent.parent.joinpath(f"manifest-{WORKER}.json").read_text())
        problem = _shards_problem(shards, index["shards"], pushed["run_id"])
    elif kind == "index.json":
        problem = index_problem(mutation.data, original)
    elif kind == "hubgym.json":
        problem = json_problem(mutation.data, original, ("verifier.path", "verifier.sha256"))
    elif kind == "verifier.py":
        problem = None if mutation.data == original else "the verifier is not the pinned one"
    LocalHub(work / "hub").commit(repo, files, f"fuzz: {mutation.name}")
    return problem


def _replace(path: Path, data: bytes) -> None:
    """Write a new file at `path` (never into the corpus file it is a hard link of)."""
    path.unlink()
    path.write_bytes(data)


def _rows(data: bytes) -> int | None:
    import pyarrow as pa

    try:
        return pa.ipc.open_file(pa.BufferReader(data)).count_rows()
    except (pa.ArrowException, OSError):
        return None


def _run_problem(run: Path, records: dict[str, dict], run_id: str) -> str | None:
    return _shards_problem({f: (run / "shards" / f).read_bytes() for f in records}, records, run_id)


def _shards_problem(shards: dict[str, bytes], records: dict[str, dict], run_id: str) -> str | None:
    """The oracle's verdict on one run's shards together (a rollout id may repeat across them)."""
    from hubgym.schemas.rollouts import ROLLOUT_SCHEMA

    seen: set[str] = set()
    for name, data in sorted(shards.items()):
        problem = shard_problem(data, ROLLOUT_SCHEMA, records[name]["rows"], seen, run_id)
        if problem:
            return f"{name}: {problem}"
    return None


# -- running the commands -----------------------------------------------------------------------------------


@functools.cache
def _cli():
    """hubgym's click command, built once (typer takes a quarter of a second to build it)."""
    import typer

    from hubgym.cli import app

    return typer.main.get_command(app)


def run_command(args: list[str]) -> dict[str, Any]:
    """One hubgym command in this process: {"code", "error_lines", "failure", "stderr", "diverged"}."""
    import click

    out, err = io.StringIO(), io.StringIO()
    code, failure = 0, None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _quiet_warnings():
        try:
            code = _cli().main(args=args, prog_name="hubgym", standalone_mode=False) or 0
        except click.ClickException as exc:
            code, failure = exc.exit_code, f"usage error: {exc.format_message()}"
        except Exception as exc:  # what the fuzzer looks for: anything but a one-line error
            code, failure = -1, _describe(exc)
    lines = [line for line in err.getvalue().splitlines() if line.startswith("error: ")]
    return {"code": code, "error_lines": len(lines), "failure": failure, "stderr": err.getvalue()[-400:],
            "diverged": args[0] == "replay" and "diverged" in out.getvalue()}


@contextlib.contextmanager
def _quiet_warnings():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _describe(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/hubgym/" in f.filename] or \
        traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}" if frames else "?"
    return f"{type(exc).__name__} at {where}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"


def judge(results: list[dict[str, Any]], invalid: str | None) -> tuple[str, str]:
    """A mutant's outcome and what shows it, from its commands' results."""
    worst, detail = "valid success", ""
    for args, result in results:
        if result["failure"] is not None or (result["code"] not in (0, 1)):
            return "traceback", f"{args[0]}: {result['failure'] or result['stderr']}"
        if result["code"] == 1 and result["error_lines"] != 1 and not result["diverged"]:
            return "traceback", f"{args[0]}: exit 1 with {result['error_lines']} error lines: {result['stderr']}"
        if result["code"] == 0 and invalid:
            worst, detail = "silent success", f"{args[0]} read it: {invalid}"
        elif result["code"] == 1 and worst == "valid success":
            worst = "clean error"
    return worst, detail


def run_mutant(seed: int, index: int, root: Path, corpus: dict[str, Any], scratch: Path, log) -> dict[str, Any]:
    work = scratch / f"m{index}"
    mutant = prepare(seed, index, root, work)
    log.write(json.dumps({"running": index, **mutant}) + "\n")
    log.flush()
    results = [(args, run_command(args)) for args in commands(mutant["kind"], work, corpus)]
    mutant["outcome"], mutant["detail"] = judge(results, mutant["invalid"])
    shutil.rmtree(work, ignore_errors=True)
    return mutant


def worker(seed: int, start: int, stop: int, root: Path, results: Path) -> None:
    """Run mutants start..stop-1 here, one JSON line each in `results` (and a line before each starts)."""
    corpus = build_corpus(root)
    scratch = results.parent / "work"
    with results.open("a") as out:
        for index in range(start, stop):
            out.write(json.dumps({"start": index}) + "\n")
            out.flush()
            out.write(json.dumps(run_mutant(seed, index, root, corpus, scratch, out)) + "\n")
            out.flush()


# -- the driver ---------------------------------------------------------------------------------------------


def fuzz(seed: int, mutants: int, root: Path, out: Path, *, timeout: float = 120.0, first: int = 0,
         progress: bool = False, values: bool = False) -> list[dict[str, Any]]:
    """Run mutants first..first+mutants-1 in child processes (a new one after a child dies); every outcome."""
    build_corpus(root)
    values_only(values)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    follow = _Follow(seed, root, results, timeout, _bar(progress, mutants))
    next_index, stop = first, first + mutants
    try:
        while next_index < stop:
            child = _child(seed, next_index, stop, root, results, out)
            try:
                next_index = follow.child(child, next_index)
            finally:  # a child still running when this ends (Ctrl-C, an error here) goes with it
                if child.poll() is None:
                    child.kill()
                    child.wait()
    finally:
        shutil.rmtree(out / "work", ignore_errors=True)
    return [follow.done[i] for i in sorted(follow.done)]


class _Follow:
    """Reads the children's results file as it grows: each mutant's outcome, and which one a child that died or
    hung was on."""

    def __init__(self, seed: int, root: Path, results: Path, timeout: float, bar) -> None:
        self.seed, self.root, self.results, self.timeout, self.bar = seed, root, results, timeout, bar
        self.done: dict[int, dict[str, Any]] = {}
        self.retried: set[int] = set()  # mutants whose child was killed from outside once
        self.offset = 0
        self.in_flight: int | None = None
        self.running: dict | None = None  # the in-flight mutant's description, once it was made
        self.since = time.monotonic()

    def child(self, child: subprocess.Popen, first: int) -> int:
        """Follow `child` until it exits or hangs; the index of the next mutant to run."""
        self.in_flight, self.running = None, None
        while True:
            time.sleep(0.05)
            code = child.poll()
            self._read()
            if code is not None:
                if self.in_flight is not None and code in KILLED and self.in_flight not in self.retried:
                    # killed from outside (a crash in the child itself is SIGSEGV, SIGABRT, SIGBUS, ...): the
                    # mutant runs once more in a fresh child, and a second such death counts as a signal
                    self.retried.add(self.in_flight)
                    index, self.in_flight, self.running = self.in_flight, None, None
                    return index
                if self.in_flight is not None:
                    name = signal.Signals(-code).name if code < 0 else f"exit code {code}"
                    outcome = "signal" if self.running else "fuzzer error"  # died making the mutant: our bug
                    self._record(self._lost(outcome, f"the child died: {name}"))
                return max(self.done, default=first - 1) + 1
            if self.in_flight is not None and time.monotonic() - self.since > self.timeout:
                child.kill()
                child.wait()
                self._read()
                if self.in_flight is not None:
                    self._record(self._lost("hang", f"no answer in {self.timeout:.0f} s"))
                return max(self.done, default=first - 1) + 1

    def _read(self) -> None:
        lines, self.offset = _read_new(self.results, self.offset)
        for line in lines:
            if "start" in line:
                self.in_flight, self.running, self.since = line["start"], None, time.monotonic()
            elif "running" in line:
                self.running = line
            else:
                self._record(line)

    def _record(self, line: dict[str, Any]) -> None:
        self.done[line["index"]], self.in_flight, self.running = line, None, None
        self.bar(line)

    def _lost(self, outcome: str, detail: str) -> dict[str, Any]:
        """The record of the in-flight mutant, which ended in `outcome` (its `running` line says what it was)."""
        if self.running is not None:
            return {**{k: v for k, v in self.running.items() if k != "running"}, "outcome": outcome,
                    "detail": detail}
        kind, name, _ = draw(self.seed, self.in_flight, self.root)
        return {"index": self.in_flight, "kind": kind, "file": name, "mutation": "?", "invalid": None,
                "outcome": outcome, "detail": detail}


def _child(seed: int, start: int, stop: int, root: Path, results: Path, out: Path) -> subprocess.Popen:
    log = (out / "child.log").open("ab")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(out / "hf"), "HUBGYM_CACHE": str(out / "cache"),
           "TOKENIZERS_PARALLELISM": "false", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, __file__, "--worker", "--seed", str(seed), "--first", str(start),
                             "--mutants", str(stop - start), "--corpus", str(root), "--out", str(out),
                             *(["--values"] if _VALUES else [])],
                            stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # a signal to the caller's process group is not the child's


def _read_new(path: Path, offset: int) -> tuple[list[dict], int]:
    if not path.exists():
        return [], offset
    with path.open() as f:
        f.seek(offset)
        text = f.read()
    complete = text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line], offset + len(complete.encode())


def _bar(progress: bool, total: int):
    """A rich progress bar on a terminal, a line every tenth of the way otherwise (a CI log)."""
    if not progress:
        return lambda line: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    bar = Progress(TextColumn("[bold]fuzz[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"), console=console, disable=not console.is_terminal)
    bar.start()
    task = bar.add_task("", total=total)
    counts: dict[str, int] = {}

    def advance(line: dict[str, Any]) -> None:
        counts[line["outcome"]] = counts.get(line["outcome"], 0) + 1
        bar.update(task, advance=1, description=", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        done = sum(counts.values())
        if not console.is_terminal and (done % max(total // 10, 1) == 0 or done == total):
            console.print(f"fuzz: {done}/{total} mutants: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if done == total:
            bar.stop()
    return advance


def summary_table(outcomes: list[dict[str, Any]]):
    """Outcomes per file kind (rows) and outcome (columns), with a total row."""
    from rich.table import Table

    table = Table("file", *OUTCOMES, "mutants", title=f"{len(outcomes)} mutants")
    kinds = sorted({o["kind"] for o in outcomes}, key=list(TARGETS).index)
    for kind in [*kinds, None]:
        mine = [o for o in outcomes if kind is None or o["kind"] == kind]
        table.add_row(kind or "all", *(str(sum(o["outcome"] == name for o in mine)) for name in OUTCOMES),
                      str(len(mine)), end_section=kind == kinds[-1])
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--first", type=int, default=0, help="index of the first mutant")
    parser.add_argument("--only", type=int, help="run this one mutant")
    parser.add_argument("--corpus", type=Path, help="corpus folder (built there once, then reused)")
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"),
                        help="outcomes.jsonl (every mutant), summary.json and the children's log")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a mutant may take")
    parser.add_argument("--save", type=Path, help="with --only: leave the mutated copy in this folder")
    parser.add_argument("--values", action="store_true", help="every mutant a value mutation of a shard")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    values_only(args.values)
    root = (args.corpus or args.out / "corpus").resolve()
    if args.worker:
        worker(args.seed, args.first, args.first + args.mutants, root, args.out.resolve() / "results.jsonl")
        return 0
    if args.only is not None and args.save:
        build_corpus(root)
        print(json.dumps(prepare(args.seed, args.only, root, args.save.resolve()), indent=2))
        for line in commands(draw(args.seed, args.only, root)[0], args.save.resolve(), build_corpus(root)):
            print("hubgym " + " ".join(line))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` runs the cleanup: the child goes too
    first, count = (args.only, 1) if args.only is not None else (args.first, args.mutants)
    outcomes = fuzz(args.seed, count, root, args.out.resolve(), timeout=args.timeout, first=first, progress=True,
                    values=args.values)
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)  # a log file gets the table unwrapped
    console.print(summary_table(outcomes))
    bad = [o for o in outcomes if o["outcome"] in BAD]
    for one in bad[:50]:
        console.print(f"[red]{one['outcome']}[/] mutant {one['index']} ({one['kind']} {one['file']}, "
                      f"{one['mutation']}): {one['detail']}", soft_wrap=True)
    (args.out / "summary.json").write_text(json.dumps({o: sum(x["outcome"] == o for x in outcomes) for o in OUTCOMES}))
    (args.out / "outcomes.jsonl").write_text("".join(json.dumps(o) + "\n" for o in outcomes))  # signals and hangs too
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
