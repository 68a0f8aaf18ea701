"""The policy on the real DeepSpeed (gloo on CPU): scaling, ZeRO stages, process counts, bad steps, resume, export,
and the GRPO loss's KL to a frozen reference with its metrics merged over micro-batches and ranks.

Each case runs tests/helpers/ds_steps.py in fresh processes (DeepSpeed's process group is per process)
on the same hand-built micro-batches and a masked token NLL, and compares the final weights, the
gradient norms and the weight hashes it logs. The reference run is ZeRO-2, one process, 3 steps,
each step's global batch cut into 2 micro-batches.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hubgym.files import replace_dir
from hubgym.train.checkpoint import latest_checkpoint
from hubgym.train.config import ConfigError
from hubgym.train.engine import DeepSpeedSettings

slow = pytest.mark.slow
SCRIPT = Path(__file__).parent / "helpers" / "ds_steps.py"
BIN = Path(sys.executable).parent
ZERO3 = ("--zero", "3", "--grad-ckpt")
LR, STEPS = 1e-2, 3  # ds_steps.py's AdamW learning rate and its default number of steps
# How closely runs that sum the same float32 gradients in another order must agree (two ranks' allreduce against one
# process's accumulation; and each CPU's kernels sum in an order of their own). The sums differ in their last bits.
# AdamW steps each weight by lr * m / (sqrt(v) + eps), about lr whatever the gradient's size, so for an element whose
# gradient is within rounding of zero a last-bit difference delta can change its step by up to lr * delta / eps
# (eps = 1e-8): the weights then differ by a small share of the lr a step moves them (seen after 3 steps at lr 1e-2:
# 0 on one x86-64 CPU, 1.1e-5 on another with AVX-512). So they must agree to 0.1% of the most AdamW moves a weight
# in those steps; a micro-batch lost or counted twice changes the update's direction, a difference of the order of
# lr itself, and the loss and gradient-norm checks beside it catch a rescaled gradient (AdamW is blind to scale).
ADAM_ROUNDING = 1e-3 * STEPS * LR


def train(model: Path, out: Path, *args: str, procs: int = 1, launcher: str = "torchrun",
          log: str = "log.json") -> dict:
    """Run ds_steps.py with `procs` processes; its log."""
    rendezvous = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    env["OMP_NUM_THREADS"] = "1"  # 2 processes on 2 cores
    if procs == 1:
        command = [sys.executable, str(SCRIPT)]
    elif launcher == "torchrun":
        command = [str(BIN / "torchrun"), "--nproc_per_node", str(procs), "--master_port", str(free_port()),
                   str(SCRIPT)]
    else:  # passes --local_rank to the script
        command = [str(BIN / "deepspeed"), "--num_gpus", str(procs), "--master_port", str(free_port()),
                   str(SCRIPT)]
    done = subprocess.run([*command, str(model), str(out), "--log-file", log, *args], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / log).read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def max_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a / "weights.safetensors")), load_file(str(b / "weights.safetensors"))
    assert x.keys() == y.keys()
    return max((x[k] - y[k]).abs().max().item() for k in x)


def column(log: dict, key: str) -> list:
    return [s[key] for s in log["steps"]]


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("ref")
    return out, train(tiny_model, out, "--reference-norm")


@pytest.fixture(scope="module")
def zero3(tiny_model, tmp_path_factory) -> tuple[Path, dict]:
    """ZeRO-3, one process, gradient checkpointing on, exported as a Hugging Face folder at the end."""
    out = tmp_path_factory.mktemp("zero3")
    return out, train(tiny_model, out, *ZERO3, "--export", str(out / "model"))


@slow
def test_zero2_lowers_the_loss_and_reports_the_summed_objective(reference):
    _, log = reference
    assert log["nll_before"] == pytest.approx(log["reference_nll"], abs=1e-5)  # Policy.logprobs = plain HF
    assert log["nll_after"] < log["nll_before"] - 1.0
    assert column(log, "skipped") == [False] * 3 and column(log, "adam_steps") == [1, 2, 3]
    assert column(log, "micro_batches") == [2, 2, 2]
    # Not averaged over the 2 accumulation steps: the norm of the gradient of the plain sum of the losses.
    assert column(log, "grad_norm")[0] == pytest.approx(log["reference_norm"], rel=1e-5)


@slow
def test_gradient_accumulation_matches_one_micro_batch_of_both(tiny_model, reference, tmp_path):
    ref_dir, ref = reference
    log = train(tiny_model, tmp_path, "--split", "1")
    assert column(log, "micro_batches") == [1, 1, 1]
    assert column(log, "grad_norm") == pytest.approx(column(ref, "grad_norm"), rel=1e-5)
    assert max_diff(ref_dir, tmp_path) < 1e-4  # padding differs: float rounding, amplified by Adam on tiny grads


@slow
def test_two_processes_match_one_on_the_same_global_batch(tiny_model, reference, tmp_path):
    ref_dir, ref = reference
    log = train(tiny_model, tmp_path, "--reference-norm", procs=2)
    assert log["world_size"] == 2 and column(log, "micro_batches") == [1, 1, 1]
    assert column(log, "tokens") == column(ref, "tokens")  # counted over both ranks
    assert column(log, "loss") == pytest.approx(column(ref, "loss"), rel=1e-5)
    assert column(log, "grad_norm")[0] == pytest.approx(log["reference_norm"], rel=1e-5)  # not halved by 2 ranks
    assert max_diff(ref_dir, tmp_path) < ADAM_ROUNDING


@slow
def test_zero3_with_gradient_checkpointing_matches_zero2(reference, zero3):
    (ref_dir, ref), (out, log) = reference, zero3
    assert log["nll_after"] < log["nll_before"] - 1.0
    assert column(log, "grad_norm") == pytest.approx(column(ref, "grad_norm"), rel=1e-5)
    assert max_diff(ref_dir, out) < 1e-4


@pytest.fixture(scope="module")
def zero3_two(tiny_model, tmp_path_factory) -> tuple[Path, dict]:
    """The same on 2 processes, started by the deepspeed launcher."""
    out = tmp_path_factory.mktemp("zero3-two")
    return out, train(tiny_model, out, *ZERO3, procs=2, launcher="deepspeed")


@slow
def test_zero3_on_two_processes_under_the_deepspeed_launcher_matches_one(zero3, zero3_two):
    (one_dir, one), (out, log) = zero3, zero3_two
    assert log["world_size"] == 2
    # Both ranks run on this machine: DeepSpeed's CPU op allreduces through shared-memory buffers, whose names
    # are gone while the ranks still run, so no exit (a SIGKILL included) leaves 66 MB a rank in /dev/shm.
    assert log["shm_buffers_used"] and log["shm_names_while_running"] == []
    assert column(log, "grad_norm") == pytest.approx(column(one, "grad_norm"), rel=1e-5)
    assert max_diff(one_dir, out) < ADAM_ROUNDING  # the gathered full weights of 2 shards = the 1-shard weights


@slow
def test_nan_loss_and_nan_gradients_skip_the_step_and_touch_nothing(tiny_model, tmp_path):
    log = train(tiny_model, tmp_path, "--steps", "4", "--nan-at", "1", "--bad-grad-at", "2")
    assert column(log, "skipped") == [False, True, True, False]
    assert column(log, "skip_reason") == [None, "non-finite loss", "non-finite gradient norm", None]
    assert column(log, "grad_norm")[1:3] == [None, None]
    weights = column(log, "weights")
    assert weights[0] == weights[1] == weights[2] != weights[3]  # bit for bit, and training goes on after
    assert column(log, "adam_steps") == [1, 1, 1, 2]  # AdamW's moments and step count untouched by the skips


@slow
def test_resume_in_fresh_processes_reproduces_the_uninterrupted_run(tiny_model, zero3_two, tmp_path):
    """ZeRO-3 on 2 processes: each rank saves its own shards and RNG; rank 0 renames the folder into place."""
    straight_dir, straight = zero3_two
    ckpt = tmp_path / "ckpt"
    (ckpt / ".partial-step-000009").mkdir(parents=True)  # what a run killed while saving leaves behind
    (ckpt / ".partial-step-000009" / "mp_rank_00_model_states.pt").write_bytes(b"half")
    first = train(tiny_model, tmp_path, *ZERO3, "--save-every", "1", "--keep", "1", "--stop-after", "2", procs=2,
                  log="first.json")
    assert column(first, "step") == [0, 1]
    assert sorted(p.name for p in ckpt.iterdir()) == ["latest.json", "step-000001"]  # kept 1, partial removed
    saved = {p.name for p in (ckpt / "step-000001").iterdir()}
    assert {"rng-rank-00000.pt", "rng-rank-00001.pt", "client.json"} <= saved
    assert json.loads((ckpt / "latest.json").read_text()) == {"tag": "step-000001", "step": 1}

    log = train(tiny_model, tmp_path, *ZERO3, "--resume", procs=2)
    assert log["resumed"] == {"step": 1, "stream": {"rows_drawn": 8}}
    assert column(log, "step") == [2]
    assert column(log, "weights") == column(straight, "weights")[2:]  # the same batch (RNG), weights and moments
    assert max_diff(straight_dir, tmp_path) == 0.0


@slow
def test_export_loads_in_transformers_and_vllm_with_the_same_greedy_tokens(tiny_model, zero3):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    out, _ = zero3
    folder = out / "model"
    trained = load_file(str(out / "weights.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    state = model.state_dict()
    assert all(torch.equal(state[k], trained[k]) for k in trained)  # lm_head tied to the embeddings again
    untrained = load_file(str(tiny_model / "model.safetensors"))
    assert not torch.equal(trained["model.norm.weight"], untrained["model.norm.weight"])
    tokenizer = AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False)

    llm = LLM(model=str(folder), dtype="float32", max_model_len=256, seed=0)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0, ignore_eos=True)
        sample = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0]
        assert llm.get_tokenizer().chat_template == tokenizer.chat_template
    finally:
        del llm
    tokens = list(sample.token_ids)
    vllm_logprobs = [next(iter(lp.values())).logprob for lp in sample.logprobs]
    with torch.no_grad():
        logits = model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1]  # (8, V): predicts each sampled token
    hf = torch.log_softmax(logits.float(), -1)
    chosen = hf.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)
    assert chosen.tolist() == pytest.approx(vllm_logprobs, abs=1e-3)
    assert (hf.max(-1).values - chosen).max().item() < 1e-3  # vLLM's greedy token is HF's argmax at every step


def test_settings_refuse_an_unsupported_zero_stage_and_say_how_to_fix_it():
    with pytest.raises(ConfigError, match=r"^zero_stage is 1; .* set optim.zero_stage to 2 .* or 3"):
        DeepSpeedSettings(zero_stage=1)
    with pytest.raises(ConfigError, match=r"^bf16 is 'yes'; use 'auto', 'true' or 'false'$"):
        DeepSpeedSettings(bf16="yes")


def test_latest_checkpoint_is_the_newest_complete_folder(tmp_path):
    for name in ("step-000002", "step-000005", "step-000007", ".partial-step-000009"):
        (tmp_path / name).mkdir()
    for name in ("step-000002", "step-000005"):
        (tmp_path / name / "client.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-000005"
    assert latest_checkpoint(tmp_path / "missing") is None


def test_replace_dir_swaps_a_whole_folder_and_leaves_nothing_behind(tmp_path):
    final, staged = tmp_path / "step-000003", tmp_path / ".partial-step-000003"
    final.mkdir(), staged.mkdir()
    (final / "first.pt").write_text("first save"), (staged / "second.pt").write_text("second save")
    replace_dir(staged, final)
    assert [p.name for p in final.iterdir()] == ["second.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003"]


@pytest.fixture(scope="module")
def kl_whole(tiny_model, tmp_path_factory) -> dict:
    """The GRPO loss with a KL to the frozen initial weights, ZeRO-2, one process, each step's global batch as one
    micro-batch: its token means are the closed form of every metric."""
    return train(tiny_model, tmp_path_factory.mktemp("kl-whole"), "--beta", "0.1", "--split", "1")


@slow
@pytest.mark.parametrize("args, procs", [(("--split", "2"), 1), ((*ZERO3, "--split", "2"), 2)],
                         ids=["zero2-two-micro-batches", "zero3-two-ranks"])
def test_kl_and_policy_metrics_are_token_means_of_the_global_batch(tiny_model, kl_whole, tmp_path, args, procs):
    """Micro-batches of different token counts, on one rank or two, report the whole batch's token means; under
    ZeRO-3 the reference is partitioned too (its forward gathers from both ranks)."""
    log = train(tiny_model, tmp_path, "--beta", "0.1", *args, procs=procs, launcher="deepspeed")
    kl = [step["metrics"]["policy/kl"] for step in log["steps"]]
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and all(k > 1e-4 for k in kl[1:]), kl  # policy = reference at first
    assert column(log, "micro_batches") == [2 // procs] * 3
    for mine, whole in zip(log["steps"], kl_whole["steps"]):
        assert mine["metrics"].keys() == whole["metrics"].keys()
        for key, value in whole["metrics"].items():
            assert mine["metrics"][key] == pytest.approx(value, rel=1e-4, abs=1e-8), key


REGROUP = """
import os, sys, torch
from hubgym.train.engine import Policy
first = Policy(sys.argv[1])
port = os.environ["MASTER_PORT"]
del first
torch.distributed.destroy_process_group()  # what an engine core that ran in this process does when it closes
second = Policy(sys.argv[1])
print(second.rank, second.world_size, os.environ["MASTER_PORT"] != port, torch.distributed.is_initialized())
"""


@slow
def test_a_policy_builds_again_after_someone_else_tore_its_group_down(tiny_model):
    """init_distributed starts a one-process group of its own (setting RANK, MASTER_PORT, ... as a launcher would).
    If something else in the process destroys it, the next Policy starts a fresh group on a fresh port, and
    DeepSpeed forgets the groups it cached from the old one (it refused them: "Group ... is not registered")."""
    rendezvous = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in rendezvous}
    done = subprocess.run([sys.executable, "-c", REGROUP, str(tiny_model)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["0", "1", "True", "True"]
