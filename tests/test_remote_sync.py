"""Rollouts from a separate vLLM server and the trainer's weights pushed into it (vllm.engine: server).

One real vLLM server (dev routes on) serves the tiny model for the module. A push of perturbed weights
changes the logprobs the server gives a fixed prompt, to those a fresh local engine gives on the same
weights, and the server reports the pushed version; a 2-step online training run samples through the
server and its rows carry the versions pushed. Bad servers are one line each: none answering, one
without the dev routes, one serving another model.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hubgym.errors import EngineError
from hubgym.hub.rollouts import iter_rollouts
from hubgym.engines import Request, SamplingArgs, VLLMEngine
from hubgym.engines.server import VLLMServer, free_port
from hubgym.train.config import TINY_CONFIG, load_config
from hubgym.train.remote_sync import RemoteWeights, ServerEngine, server_root, sync_remote_weights
from hubgym.train.trainer import Trainer

pytestmark = pytest.mark.slow
PROMPT = [1, 7, 42, 99, 5, 300, 12]
GREEDY = SamplingArgs(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    with VLLMServer(tiny_model, max_model_len=512, enforce_eager=True, tool_parser=None, dev_mode=True,
                    log_path=log) as server:
        yield server


def greedy(engine) -> tuple[list[int], list[float]]:
    request = Request(ids=PROMPT, messages=[], tools=None, n=1, max_tokens=GREEDY.max_tokens, seed=0)
    sample = asyncio.run(engine.generate(request, GREEDY))[0]
    return sample.token_ids, sample.logprobs


def perturbed(tiny_model) -> dict[str, torch.Tensor]:
    """The tiny model's weights with seeded noise: other logprobs, the same names and shapes."""
    generator = torch.Generator().manual_seed(0)
    weights = load_file(str(tiny_model / "model.safetensors"))
    return {name: t + 0.5 * torch.randn(t.shape, generator=generator) * t.float().std().clamp(min=1e-3)
            if t.is_floating_point() and t.dim() > 1 else t for name, t in weights.items()}


def test_a_push_serves_the_new_weights_as_a_fresh_engine_does(server, tiny_model, tmp_path):
    engine = ServerEngine(str(tiny_model), server.base_url, max_model_len=512)
    before = greedy(engine)
    weights = perturbed(tiny_model)
    sync_remote_weights(engine, weights, policy_version=3, scratch=tmp_path / "sync")
    after = greedy(engine)
    assert after[1] != pytest.approx(before[1], abs=1e-3), "the server still samples with the old weights"
    assert engine.weights.version() == "3" and engine.policy_version == 3

    folder = tmp_path / "model"  # the same weights as a model folder, in a fresh local engine
    shutil.copytree(tiny_model, folder)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    local = VLLMEngine(str(folder), max_model_len=512, enforce_eager=True, separate_core=True)
    try:
        fresh = greedy(local)
    finally:
        local.close()
    assert after[0] == fresh[0]
    assert after[1] == pytest.approx(fresh[1], abs=1e-3)


def test_online_training_samples_through_the_server(server, tiny_model, tmp_path):
    cfg = load_config(TINY_CONFIG, [f"model={tiny_model}", f"output_dir={tmp_path / 'run'}", "online.steps=2",
                                    "online.max_model_len=512", "vllm.engine=server",
                                    f"vllm.base_url={server.base_url}", "eval.limit=0", "log.every=1000",
                                    "batch.groups_per_step=2", "grpo.n=2", "grpo.zero_variance=keep"])
    trainer = Trainer(cfg)
    try:
        result = trainer.run()
    finally:
        trainer.close()
    assert result.steps == 2 and result.counts["weight_syncs"] == 2  # v0 (the server's weights are unknown), v1
    rows = list(iter_rollouts([tmp_path / "run" / "online"]))
    assert sorted({r["provenance"]["policy_version"] for r in rows}) == [0, 1]
    assert all(r["completion_ids"] and len(r["completion_logprobs"]) == len(r["completion_ids"]) for r in rows)
    assert RemoteWeights(server_root(server.base_url), str(tiny_model)).version() == "1"


def test_a_server_that_does_not_answer_names_the_setting(tiny_model):
    with pytest.raises(EngineError, match=r"no vLLM server answers at .*\(vllm.base_url\)"):
        ServerEngine(str(tiny_model), f"http://127.0.0.1:{free_port()}/v1")


def test_a_server_with_another_model_is_refused(server, tiny_model, tmp_path):
    other = shutil.copytree(tiny_model, tmp_path / "other-model")
    with pytest.raises(EngineError, match=r"serves .* not the trainer's model .*vllm.served_model"):
        ServerEngine(str(other), server.base_url)


def test_nccl_transfer_needs_a_gpu(tiny_model):
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here")
    with pytest.raises(EngineError, match="vllm.weight_transfer=nccl .* no CUDA GPU"):
        RemoteWeights("http://127.0.0.1:1", str(tiny_model), transfer="nccl")


def test_a_server_without_dev_routes_says_how_to_start_it(server, tiny_model):
    """The same server restarted without VLLM_SERVER_DEV_MODE (last: the other tests need the routes)."""
    server.stop()
    server.dev_mode = False
    server.start()
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
        ServerEngine(str(tiny_model), server.base_url)
