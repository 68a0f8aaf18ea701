"""In-memory weight sync (buckets through shared memory, or inside vLLM's RPC, into its workers' load_weights) serves
exactly what a file sync of the same weights serves, whatever the bucket size; a restart after it serves those
weights again from disk."""

from __future__ import annotations

import pytest

from hubgym.train import sync
from hubgym.train.sync import WEIGHTS_FILE, has_receiver, restart_engine, sync_weights

from helpers.logprobs import TOL, hf_logprobs, perturbed, vllm_logprobs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tiny_model):
    from hubgym.engines import VLLMEngine

    engine = VLLMEngine(str(tiny_model), max_model_len=512, separate_core=True)
    yield engine
    engine.close()


def test_in_memory_sync_serves_what_a_file_sync_serves(engine, tiny_model, tmp_path, monkeypatch):
    ids = engine.tokenizer.encode("What is 2 + 3? Reverse the text, then write the answer.")
    assert has_receiver(engine)
    model = perturbed(tiny_model, 1)
    sync_weights(engine, model.state_dict(), 1, tmp_path / "file", in_memory=False)
    by_file, tokens, sampled, _ = vllm_logprobs(engine, ids)
    sync_weights(engine, perturbed(tiny_model, 2).state_dict(), 2, tmp_path / "memory")  # something else between
    assert vllm_logprobs(engine, ids)[0] != pytest.approx(by_file, abs=TOL)

    monkeypatch.setattr(sync, "BUCKET_BYTES", 64 << 10)  # ~10 buckets: layers arrive split over several RPCs
    sync_weights(engine, model.state_dict(), 3, tmp_path / "memory")
    in_memory, tokens_m, sampled_m, done = vllm_logprobs(engine, ids)
    assert in_memory == pytest.approx(by_file, abs=1e-5) and tokens_m == tokens
    assert sampled_m == pytest.approx(sampled, abs=1e-5)
    assert in_memory == pytest.approx(hf_logprobs(model, ids), abs=TOL)
    assert engine.policy_version == 3 and done.weight_versions[-1].version == "3"  # labelled as a file sync does
    assert not (tmp_path / "memory" / WEIGHTS_FILE).exists()  # nothing written per step

    monkeypatch.setattr(sync, "shared_memory_dir", lambda: None)  # no /dev/shm: the buckets go inside the RPC
    sync_weights(engine, perturbed(tiny_model, 2).state_dict(), 4, tmp_path / "memory")
    sync_weights(engine, model.state_dict(), 5, tmp_path / "memory")
    assert vllm_logprobs(engine, ids)[0] == pytest.approx(by_file, abs=1e-5)

    restart_engine(engine)  # the weights synced in memory are written now, and the new engine loads them
    assert (tmp_path / "memory" / WEIGHTS_FILE).exists() and engine.policy_version == 5
    assert vllm_logprobs(engine, ids)[0] == pytest.approx(by_file, abs=1e-5)


def test_buckets_keep_order_and_bound_their_size():
    import torch

    tensors = {f"t{i}": torch.zeros(n) for i, n in enumerate([10, 10, 30, 5, 5, 5])}  # float32: 4 bytes each
    groups = list(sync.buckets(tensors, 80))
    assert [list(b) for b in groups] == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"]]
