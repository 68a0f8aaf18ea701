"""A TRL GRPOTrainer run recorded as a hubgym run (`env.record(trainer, out)`): two steps of TRL's own trainer with
the tiny model on the CPU, a single_turn env and a multi_turn env played through `act`, each recorded once for the
module; then every hubgym reader of runs takes the recording as it takes its own runs: report, score (fresh rewards
equal the stored ones), replay (the multi_turn episodes reproduce, the token audit agrees with what was stored),
view, push-rollouts to the loopback Hub-API server and offline training streamed back from there."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.hub.rollouts import iter_rollouts
from hubgym.integrations.trl import TASK_COLUMN, trl_env

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
runner = CliRunner()
STEPS, GROUP, PROMPTS = 2, 4, 1  # TRL steps; samples per prompt; prompts per step
GUESS = "slate"


@dataclass
class Recorded:
    """One recorded TRL run: the folder, the env, and what TRL itself handed its reward functions each step."""

    out: Path
    env: object
    seen: list[dict] = field(default_factory=list)  # per generation batch: completion ids and hubgym_task rows
    logs: list[dict] = field(default_factory=list)  # TRL's logged metrics per step

    def rows(self) -> list[dict]:
        return list(iter_rollouts(self.out))


def run_trl(env, model: Path, out: Path, work: Path, tokenizer, max_tokens: int, generation_kwargs: dict) -> Recorded:
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    recorded = Recorded(out, env)

    def witness(prompts, completions, completion_ids, hubgym_task, **_):  # weight 0: sees what TRL generated
        recorded.seen.append({"completion_ids": [list(c) for c in completion_ids], "tasks": list(hubgym_task)})
        return [0.0] * len(completions)

    class KeepLogs(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                recorded.logs.append(dict(logs))

    kwargs = env.trainer_kwargs()
    kwargs["reward_funcs"] = kwargs["reward_funcs"] + [witness]
    args = GRPOConfig(output_dir=str(work), max_steps=STEPS, per_device_train_batch_size=GROUP * PROMPTS,
                      num_generations=GROUP, max_completion_length=max_tokens, learning_rate=1e-2, logging_steps=1,
                      report_to="none", use_cpu=True, seed=0, reward_weights=env.reward_weights + [0.0],
                      save_strategy="no", bf16=False, max_tool_calling_iterations=3, disable_tqdm=True,
                      generation_kwargs=generation_kwargs)
    trainer = GRPOTrainer(str(model), args=args, processing_class=tokenizer, callbacks=[KeepLogs()], **kwargs)
    env.record(trainer, out)  # the one line
    trainer.train()
    return recorded


def no_specials(tokenizer) -> dict:
    """Keep the random model from sampling special tokens inside a reply: TRL decodes replies without them, so such
    a row's text is not what its tokens spell (the token audit fails it, rightly, and training leaves it out)."""
    return {"suppress_tokens": [i for i in (tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>",
                                                                                          "<|im_start|>"))]}


def steer_to_act(tokenizer) -> dict:
    """The random model made to reply with a Hermes tool call of `act` (sequence_bias on each prefix of the call)."""
    call = json.dumps({"name": "act", "arguments": {"action": f"<guess>{GUESS}</guess>"}})
    ids = tokenizer(f"<tool_call>\n{call}\n</tool_call>{tokenizer.eos_token}", add_special_tokens=False)["input_ids"]
    return {"sequence_bias": [[ids[:k + 1], 100.0 + 10.0 * k] for k in range(len(ids))]}


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory) -> dict[str, Recorded]:
    from transformers import AutoTokenizer

    from hubgym.integrations.trl import tool_parsing_tokenizer

    root = tmp_path_factory.mktemp("trl-record")
    plain = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    tools = tool_parsing_tokenizer(AutoTokenizer.from_pretrained(tiny_model, padding_side="left"))
    return {
        "arithmetic": run_trl(trl_env("arithmetic:tiny", limit=4), tiny_model, root / "arith", root / "trl-a", plain,
                              24, no_specials(plain)),
        "wordle": run_trl(trl_env("wordle", limit=4), tiny_model, root / "wordle", root / "trl-w", tools, 160,
                          steer_to_act(tools)),
    }


def invoke(*args: str) -> str:
    done = runner.invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return done.output


# -- what is stored --------------------------------------------------------------------------------------------------

def test_every_generation_batch_is_stored_with_the_token_ids_trl_generated(recorded):
    for name, run in recorded.items():
        rows = sorted(run.rows(), key=lambda r: (r["provenance"]["policy_version"], r["group"], r["sample"]))
        assert len(rows) == STEPS * GROUP * PROMPTS and len(run.seen) == STEPS, name
        for step, batch in enumerate(run.seen):
            stored = [r for r in rows if r["provenance"]["policy_version"] == step]
            assert [r["completion_ids"] for r in stored] == batch["completion_ids"], name
            assert [r["task_id"] for r in stored] == [json.loads(t)["id"] for t in batch["tasks"]]
            assert len({r["group"] for r in stored}) == PROMPTS and [r["sample"] for r in stored] == list(range(GROUP))
        for row in rows:
            assert len(row["completion_mask"]) == len(row["completion_ids"]) == len(row["completion_logprobs"])
            provenance = row["provenance"]
            assert provenance["engine"] == "trl" and provenance["engine_version"].startswith("trl 1.16")
            assert json.loads(provenance["sampling"])["n"] == GROUP and provenance["verifier_sha256"]
        manifest = json.loads(next(run.out.glob("manifest-*.json")).read_text())
        assert manifest["rows"] == len(rows) and manifest["recorded_from"] == "trl"


def test_stored_logprobs_are_the_sampling_policys_own(recorded, tiny_model):
    """Step-0 rows were sampled by the initial weights: a forward pass of the model folder over the stored ids
    gives each sampled token's logprob (mask 1), and env/tool tokens hold 0.0."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for run in recorded.values():
        for row in (r for r in run.rows() if r["provenance"]["policy_version"] == 0):
            ids = torch.tensor([row["prompt_ids"] + row["completion_ids"]])
            with torch.no_grad():
                logits = model(input_ids=ids).logits[0, :-1].float()  # (T-1, V): position t predicts t+1
            want = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[len(row["prompt_ids"]) - 1:, 0]
            for got, expected, mask in zip(row["completion_logprobs"], want.tolist(), row["completion_mask"]):
                assert got == pytest.approx(expected, abs=1e-4) if mask else got == 0.0


def test_a_multi_turn_episode_keeps_model_and_env_tokens_apart_and_its_steps(recorded, tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = recorded["wordle"].rows()
    for row in rows:
        assert row["interaction"]["kind"] == "multi_turn" and "act" in row["interaction"]["tools"]
        call, result = row["completion"][0], row["completion"][1]
        assert call["tool_calls"][0]["name"] == "act" and json.loads(call["tool_calls"][0]["arguments"]) == {
            "action": f"<guess>{GUESS}</guess>"}
        env_tokens = [t for t, m in zip(row["completion_ids"], row["completion_mask"]) if not m]
        assert result["role"] == "tool" and result["content"] in tokenizer.decode(env_tokens)  # the observation: 0
        assert "<tool_call>" in tokenizer.decode([t for t, m in zip(row["completion_ids"], row["completion_mask"])
                                                  if m])  # the call: the model's own tokens, mask 1
        steps = [m for m in row["metrics"] if m["name"].startswith("step/")]
        assert steps and row["reward"] == pytest.approx(sum(m["value"] for m in steps))
    logged = [log["reward"] for log in recorded["wordle"].logs]
    by_step = [sum(r["reward"] for r in rows if r["provenance"]["policy_version"] == s) / GROUP for s in range(STEPS)]
    assert logged == pytest.approx(by_step)  # what TRL trained on is what is stored


# -- every reader of runs --------------------------------------------------------------------------------------------

def test_report_reads_the_recorded_runs(recorded):
    for name, run in recorded.items():
        out = invoke("report", str(run.out))
        assert re.search(rf"rollouts\s+{STEPS * GROUP * PROMPTS}\b", out) and name in out


def test_score_gives_the_stored_rewards_again(recorded):
    for run in recorded.values():
        out = invoke("score", str(run.out), "--workers", "1")
        assert f"what changed: 0 of {STEPS * GROUP * PROMPTS} rows" in out


def test_replay_reproduces_the_multi_turn_episodes_and_the_token_audit_agrees(recorded, tiny_model):
    from hubgym.score.replay import replay

    for name, run in recorded.items():
        report = replay(run.out, model=tiny_model)
        counts = report.counts()
        stored_bad = sum(not r["tokens_consistent"] for r in run.rows())
        assert counts["diverged"] == 0 and counts["token_audit_failures"] == stored_bad, name
        if name == "wordle":
            assert counts["replayed"] == counts["reproduced"] == STEPS * GROUP * PROMPTS and stored_bad == 0
    out = invoke("replay", str(recorded["wordle"].out), "--model", str(tiny_model))
    assert re.search(rf"wordle\s+{STEPS * GROUP}\s+{STEPS * GROUP}\s+{STEPS * GROUP}\s+0", out)


def test_view_serves_the_recorded_run(recorded, tiny_model):
    import httpx
    import uvicorn

    from hubgym.engines.server import free_port
    from hubgym.viewer import RunStore, make_app, tokenizer_decoder

    run = recorded["wordle"]
    store = RunStore.open([str(run.out)])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(store, tokenizer_decoder(str(tiny_model))), host="127.0.0.1",
                                           port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        assert "wordle" in httpx.get(f"{base}/").text
        row = run.rows()[0]
        page = httpx.get(f"{base}/run/0/rollout/{row['rollout_id']}").text
        assert row["completion"][1]["content"].split(" ->")[0] in page and "act" in page
        first_step = next(m["value"] for m in row["metrics"] if m["name"] == "step/0/reward")
        assert f'<b class="step-reward">{first_step:.3f}</b>' in page  # the act call that stepped, with its reward
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_recorded_run_pushed_to_a_hub_trains_offline_streamed_from_there(recorded, hub_client, tiny_model,
                                                                             tmp_path):
    refs = []
    for name, run in recorded.items():
        shared = invoke("push-rollouts", str(run.out), "org/trl-runs", "--name", f"trl-{name}", "--hub",
                        hub_client.url)
        refs.append(re.search(r"-> (org/trl-runs@[0-9a-f]{40}:trl-" + name + ")", shared).group(1))
    out, config = tmp_path / "train", tmp_path / "train.yaml"
    config.write_text(json.dumps({
        "model": str(tiny_model), "output_dir": str(out), "envs": [{"name": "arithmetic:tiny"}, {"name": "wordle"}],
        "offline": {"sources": refs, "steps": 2}, "online": {"steps": 0}, "eval": {"limit": 0},
        "grpo": {"n": GROUP, "zero_variance": "keep"}, "batch": {"groups_per_step": 2}, "log": {"every": 1000}}))
    invoke("train", str(config), "--hub", hub_client.url)
    steps = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "policy/loss" in r]
    assert [r["step"] for r in steps] == [0, 1] and all(r["train/groups"] >= 1 for r in steps)


def test_the_docs_trl_example_runs_as_printed(tmp_path):
    """The TRL example of docs/integrations.md, taken from the page as printed, run in a fresh process (tiny model)."""
    import subprocess
    import sys

    page = (Path(__file__).resolve().parent.parent / "docs" / "integrations.md").read_text()
    block = re.search(r"## TRL.*?```python\n(.*?)```", page, re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(block)  # its relative paths (out, runs/trl-wordle) land in tmp_path, the working folder
    from hubgym.engines.offline import RENDEZVOUS_VARIABLES

    # a user's shell, not this worker's: an earlier training test's store still holds its MASTER_PORT
    fresh = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARIABLES}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=900,
                          env={**fresh, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(iter_rollouts(tmp_path / "runs" / "trl-wordle"))
    assert rows and {r["env"] for r in rows} == {"wordle"} and all(r["provenance"]["engine"] == "trl" for r in rows)
    shown = [line for line in done.stdout.splitlines() if line.startswith("TRLEnv(")]
    assert len(shown) == 1 and TASK_COLUMN not in done.stdout  # print(env): one line, not its task rows
