"""`hubgym export sft`: stored rollouts as the conversational dataset TRL's SFTTrainer takes. Tool calls and tool
results land in the chat format's own fields and render through a real chat template with the row's tool schemas;
the card names the sources and the selection; a failed export leaves the folder it would replace as it was; and a
real run of the tiny model, exported and pushed to the loopback Hub-API server, loads with `datasets.load_dataset`
and trains two steps in TRL's SFTTrainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from hubgym.envs import build_tasks
from hubgym.errors import SelectionError
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas import assistant, tool_call, tool_result
from hubgym.score.export_sft import export_sft
from hubgym.score.select import Selection, selection_from_sets

from helpers.scored_runs import CREATED_AT, make_run

HUBGYM = str(Path(sys.executable).with_name("hubgym"))


def tool_use_run(folder: Path) -> Path:
    """Two rollouts of calc_tools:calculator, each a calculator call, its result and a final answer."""
    tasks = build_tasks("calc_tools", "calculator")["test"]
    writer = ShardWriter(folder, "w000of001")
    for g in range(2):
        task = tasks[g]
        call = tool_call(f"call-{g}", "calculator", json.dumps({"expression": "6*7"}))
        completion = [assistant(None, [call]), tool_result("42", f"call-{g}", "calculator"),
                      assistant(f"<answer>{task['info']['answer']}</answer>")]
        writer.add_group([{
            "rollout_id": f"t{g}", "run_id": "tools", "task_id": task["id"], "env": "calc_tools", "group": f"g{g}",
            "sample": 0, "prompt": task["prompt"], "completion": completion, "info": task["info"],
            "interaction": task["interaction"], "prompt_ids": [1, 2], "completion_ids": [3, 4, 5],
            "completion_mask": [1, 0, 1], "completion_logprobs": [-0.1, 0.0, -0.2], "tokens_consistent": True,
            "reward": 1.0, "metrics": [{"name": "success", "value": 1.0}], "finish_reason": "stop", "truncated": False,
            "num_turns": 2, "error": None,
            "provenance": {"model": "m", "policy_version": 0, "sampling": "{}", "env_repo": None, "env_revision": None,
                           "verifier_module": "v", "verifier_sha256": "0" * 64, "engine": "vllm",
                           "engine_version": "0", "chat_template_sha256": None},
            "timings": {"generate_s": 0.0, "tools_s": 0.0, "score_s": 0.0, "total_s": 0.0}, "created_at": CREATED_AT}])
    writer.flush()
    writer.write_manifest({"run_id": "tools", "model": "m", "policy_version": 0, "sampling": {}, "envs": {},
                           "shard_files": writer.shard_files()})
    return folder


def test_a_tool_use_rollout_exports_its_calls_results_and_tool_schemas(tmp_path, tiny_model):
    from transformers import AutoTokenizer

    result = export_sft([str(tool_use_run(tmp_path / "run"))], tmp_path / "sft")
    rows = datasets.load_dataset(str(tmp_path / "sft"), split="train")
    assert result.rows == len(rows) == 2 and rows["rollout_id"] == ["t0", "t1"]
    messages = rows[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    call = messages[2]["tool_calls"][0]
    assert call == {"id": "call-0", "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'}}
    assert messages[3]["tool_call_id"] == "call-0" and messages[3]["content"] == "42"
    tools = json.loads(rows[0]["tools"])
    assert [t["function"]["name"] for t in tools] == ["calculator"]
    text = AutoTokenizer.from_pretrained(tiny_model).apply_chat_template(messages, tools=tools, tokenize=False)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n</tool_call>' in text
    assert "<tool_response>\n42\n</tool_response>" in text
    assert '"name": "calculator"' in text.split("To call a function")[0]  # the schema, in the system turn
    card = (tmp_path / "sft" / "README.md").read_text()
    assert str(tmp_path / "run") in card and "no rules (every usable row)" in card


def test_the_card_names_the_selection_and_a_failed_export_leaves_the_old_folder(tmp_path):
    run = make_run(tmp_path / "run", "r", groups=6, n=2)
    export_sft([str(run)], tmp_path / "sft", selection_from_sets(["min_reward=1", "best_of_group=1"]))
    before = {p.name: p.read_bytes() for p in (tmp_path / "sft").rglob("*") if p.is_file()}
    assert "`min_reward=1, best_of_group=1`" in before["README.md"].decode()
    assert "| dropped: best_of_group | 6 |" in before["README.md"].decode()  # the wrong halves, before min_reward
    with pytest.raises(SelectionError, match="keeps none of the 12 rows"):
        export_sft([str(run)], tmp_path / "sft", Selection(min_reward=5))
    assert {p.name: p.read_bytes() for p in (tmp_path / "sft").rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".sft")] == []  # no staged folder left
    with pytest.raises(SelectionError, match="no selection rule 'min_rewards'; did you mean 'min_reward'?"):
        selection_from_sets(["min_rewards=1"])
    with pytest.raises(SelectionError, match=r"invalid selection: best_of_group=0: Input should be greater than"):
        selection_from_sets(["best_of_group=0"])


@pytest.mark.slow
def test_an_exported_tiny_model_run_loads_from_a_hub_and_trains_two_sft_steps_in_trl(tiny_model, hub_client, tmp_path):
    from hubgym.engines import SamplingArgs
    from hubgym.rollout import RolloutConfig, run_rollouts

    out = tmp_path / "run"
    run_rollouts(RolloutConfig(envs=["arithmetic:tiny"], model=str(tiny_model), out=str(out), n=4, limit=6,
                               sampling=SamplingArgs(max_tokens=24), max_model_len=512))
    done = subprocess.run([HUBGYM, "export", "sft", str(out), "--out", str(tmp_path / "sft"), "--set",
                           "best_of_group=2", "--push", "org/tiny-sft", "--hub", hub_client.url],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert "read 24" in said and "dropped: best_of_group 12" in said and "kept 12" in said
    assert "pushed -> org/tiny-sft@" in said

    dataset = datasets.load_dataset("org/tiny-sft", split="train")  # from the Hub-API server, over HTTP
    assert len(dataset) == 12 and set(dataset["env"]) == {"arithmetic"}
    assert all(m[-1]["role"] == "assistant" for m in dataset["messages"])

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = SFTTrainer(model=model, processing_class=AutoTokenizer.from_pretrained(tiny_model),
                         train_dataset=dataset.select_columns(["messages", "tools"]),
                         args=SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=2, per_device_train_batch_size=4,
                                        learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no",
                                        logging_steps=1, dataloader_num_workers=0))
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    assert len(changed) == len(before), set(before) - set(changed)  # every trainable parameter moved
