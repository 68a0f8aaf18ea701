"""verifiers 0.4 and hubgym: verifiers' own `vf-eval` runs a hubgym env (`hubgym_verifiers`) against the instant
server; its rewards equal hubgym's verifier on the same completions; `hubgym import verifiers` makes what it wrote a
run that report, score and train read, with token records equal to those hubgym's own loop keeps for the same
conversations, and flags what it re-derived."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.hub.rollout_reader import iter_rollouts
from hubgym.envs import resolve_env

ENV, LIMIT, SAMPLES = "wordle", 2, 2
runner = CliRunner()


def vf_eval(tiny_model: Path, base_url: str, out: Path) -> Path:
    """verifiers' own evaluation of the hubgym env: its harness program (the `null` chat loop, run by uv in a
    subprocess runtime) talks to the server through verifiers' interception proxy."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PRIME_API_KEY": "EMPTY", "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                          os.environ.get("PYTHONPATH", "")])}
    command = [str(bin_dir / "vf-eval"), "hubgym_verifiers", "--env.taskset.env", ENV, "--env.taskset.limit",
               str(LIMIT), "-r", str(SAMPLES), "-m", str(tiny_model), "--client.base-url", base_url, "--no-push",
               "--no-rich", "-o", str(out), "--run.name", "vf", "--env.agent.harness.id", "null",
               "--env.agent.runtime.type", "subprocess"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / "vf"


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory):
    """(verifiers' run folder, hubgym's own run of the same env and tasks against the same server)."""
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts
    from hubgym.rollout.instant_server import InstantServer

    root = tmp_path_factory.mktemp("verifiers")
    with InstantServer(tiny_model, log_path=root / "instant.log") as server:
        results = vf_eval(tiny_model, server.url(ENV), root / "outputs")
        config = RolloutConfig(envs=[ENV], model=str(tiny_model), out=str(root / "native"), engine="openai",
                               base_url=server.url(ENV), n=SAMPLES, limit=LIMIT, sampling=SamplingArgs(max_tokens=64),
                               max_model_len=2048)
        run_rollouts(config, progress=False)
    return results, root / "native"


def traces(results: Path) -> list[dict]:
    lines = (results / "traces.jsonl").read_text().splitlines()
    return [trace for line in lines for trace in json.loads(line)["traces"]]


@pytest.mark.slow
def test_verifiers_evaluates_a_hubgym_env_and_its_rewards_are_hubgyms(runs):
    from hubgym.integrations.verifiers_traces import messages_of

    results, _ = runs
    verifier = resolve_env(ENV).verifier()
    found = traces(results)
    assert len(found) == LIMIT * SAMPLES
    for trace in found:
        task = json.loads(trace["task"]["data"]["hubgym_task"])
        _, completion, _ = messages_of(trace, "trace", task)
        assert sum(1 for m in completion if m["role"] == "assistant") > 1  # the episode was played, turn by turn
        verifiers_total = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert verifiers_total == pytest.approx(verifier.score(task, completion).reward)


@pytest.mark.slow
def test_imported_traces_are_a_run_that_report_score_and_train_read(runs, tiny_model, tmp_path):
    from hubgym.rollout import scan_rollouts, summarize
    from hubgym.score import rescore

    results, native = runs
    out = tmp_path / "imported"
    done = runner.invoke(app, ["import", "verifiers", str(results), "--out", str(out), "--model", str(tiny_model)])
    assert done.exit_code == 0, done.output
    rows = list(iter_rollouts(out))
    assert len(rows) == LIMIT * SAMPLES
    by_task = {r["task_id"]: r for r in iter_rollouts(native)}
    for row in rows:  # the re-derived token record is the one hubgym's loop keeps for the same conversation
        mine = by_task[row["task_id"]]
        assert row["completion"] == mine["completion"] and row["prompt"] == mine["prompt"]
        assert (row["prompt_ids"], row["completion_ids"]) == (mine["prompt_ids"], mine["completion_ids"])
        assert row["completion_mask"] == mine["completion_mask"] and row["tokens_consistent"]
        flags = {m["name"]: m["value"] for m in row["metrics"] if m["name"].startswith("import/")}
        assert flags == {"import/token_ids_rederived": 1.0, "import/logprobs_rederived": 1.0}
        assert "re-derived" in row["provenance"]["engine_version"] and row["provenance"]["engine"] == "verifiers"
        model_lps = [lp for lp, m in zip(row["completion_logprobs"], row["completion_mask"]) if m]
        assert all(lp < 0 for lp in model_lps) and len(row["completion_logprobs"]) == len(row["completion_ids"])

    table = summarize(scan_rollouts([out]), None).to_dicts()[0]
    expected = [sum(r["score"] * r["weight"] for r in t["rewards"].values()) for t in traces(results)]
    assert table["rollouts"] == len(expected) and table["mean_reward"] == pytest.approx(sum(expected) / len(expected))
    rescored = rescore(out, workers=1)
    assert rescored.counts["changed"].sum() == 0 and rescored.counts["rows"].sum() == len(rows)

    trained = train_offline(tiny_model, out, tmp_path / "train")
    assert trained and trained[0]["train/groups"] == LIMIT


def train_offline(model, source, out) -> list[dict]:
    """One offline GRPO step of the trainer on the imported run (the groups' samples are alike: kept, not dropped)."""
    from rich.console import Console

    from hubgym.train.config import TINY_CONFIG, load_config
    from hubgym.train.trainer import Trainer

    sets = [f"model={model}", f"output_dir={out}", f"envs=[{{name: {ENV}}}]", f"offline.sources=[{source}]",
            "offline.steps=1", "eval.limit=0",
            f"batch.groups_per_step={LIMIT}", f"grpo.n={SAMPLES}", "grpo.zero_variance=keep", "log.every=1000",
            "loss.max_staleness=0", "online.steps=0"]
    trainer = Trainer(load_config(TINY_CONFIG, sets), console=Console(file=io.StringIO()))
    try:
        trainer.run()
    finally:
        trainer.close()
    return [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]


@pytest.mark.slow
def test_a_tool_use_env_is_refused_by_vf_eval_as_one_message_not_a_traceback(tmp_path):
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "vf-eval"), "hubgym_verifiers", "--env.taskset.env", "calc_tools", "-m", "m",
               "--client.base-url", "http://127.0.0.1:9/v1", "--no-push", "-o", str(tmp_path / "out"),
               "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PRIME_API_KEY": "EMPTY", "COLUMNS": "400"})
    said = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in said, said[-3000:]
    assert "hubgym env 'calc_tools' is tool_use, which hubgym does not offer to verifiers" in said
    assert not (tmp_path / "out").exists()  # refused while the config is read: nothing started, nothing written


# -- bad input (no verifiers needed) -------------------------------------------------------------------------------

def test_a_missing_results_folder_is_one_line(tmp_path):
    done = runner.invoke(app, ["import", "verifiers", str(tmp_path), "--out", str(tmp_path / "o"), "--model", "tiny"])
    assert done.exit_code == 1 and "holds no traces.jsonl" in done.output and "Traceback" not in done.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("line, says", [
    ("{not json", "traces.jsonl:2 is not JSON"),
    (json.dumps({"id": "e"}), "traces.jsonl:2 has no field 'traces'"),
    (json.dumps({"traces": [{"task": {"data": {"prompt": "hi"}}, "nodes": []}]}),
     "traces.jsonl:2 traces[0] task.data has no hubgym_task: the trace is not of a hubgym env"),
    (json.dumps({"traces": [{"task": {"data": {"hubgym_task": json.dumps({"id": "t", "env": "wordle"})}},
                             "nodes": []}]}), "has no field 'info'"),
])
def test_a_bad_trace_line_names_the_file_line_and_field_and_writes_nothing(tmp_path, line, says):
    results = tmp_path / "results"
    results.mkdir()
    (results / "traces.jsonl").write_text("\n" + line + "\n")
    done = runner.invoke(app, ["import", "verifiers", str(results), "--out", str(tmp_path / "o"), "--model", "tiny"])
    assert done.exit_code == 1 and says in done.output and "Traceback" not in done.output, done.output
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_trace_that_carries_its_token_record_keeps_it(runs, tiny_model, tmp_path):
    """verifiers' token-returning client (a route stock vLLM lacks) puts ids, masks and logprobs on the trace's
    nodes: such a trace (here verifiers' own, given the record hubgym's loop kept for the same conversation) imports
    with that record, nothing re-derived."""
    results, native = runs
    by_task = {r["task_id"]: r for r in iter_rollouts(native)}
    lines = []
    for line in (results / "traces.jsonl").read_text().splitlines():
        episode = json.loads(line)
        for trace in episode["traces"]:
            mine = by_task[trace["task"]["data"]["id"]]
            first = next(i for i, n in enumerate(trace["nodes"]) if n["sampled"])
            trace["nodes"][0]["token_ids"] = mine["prompt_ids"]
            trace["nodes"][first].update(token_ids=mine["completion_ids"], logprobs=mine["completion_logprobs"],
                                         mask=[bool(m) for m in mine["completion_mask"]])
        lines.append(json.dumps(episode))
    (tmp_path / "traces.jsonl").write_text("\n".join(lines) + "\n")
    done = runner.invoke(app, ["import", "verifiers", str(tmp_path / "traces.jsonl"), "--out", str(tmp_path / "run"),
                               "--model", str(tiny_model)])
    assert done.exit_code == 0, done.output
    for row in iter_rollouts(tmp_path / "run"):
        mine = by_task[row["task_id"]]
        assert (row["prompt_ids"], row["completion_ids"]) == (mine["prompt_ids"], mine["completion_ids"])
        assert row["completion_mask"] == mine["completion_mask"]
        assert row["completion_logprobs"] == pytest.approx(mine["completion_logprobs"])
        flags = {m["name"]: m["value"] for m in row["metrics"] if m["name"].startswith("import/")}
        assert flags == {"import/token_ids_rederived": 0.0, "import/logprobs_rederived": 0.0}
        assert "re-derived" not in row["provenance"]["engine_version"]
