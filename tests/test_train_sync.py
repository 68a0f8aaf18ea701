"""Weight sync into a running vLLM engine: after a sync vLLM samples from the trainer's weights."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.slow


def _vllm_logprobs(engine, ids: list[int]) -> tuple[list[int], list[float]]:
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0, ignore_eos=True)
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0].outputs[0]
    return list(out.token_ids), [next(iter(lp.values())).logprob for lp in out.logprobs]


def _hf_logprobs(model, ids: list[int], sampled: list[int]) -> list[float]:
    full = torch.tensor([ids + sampled])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(full).logits[0, :-1].float(), -1)
    return [logprobs[len(ids) - 1 + i, t].item() for i, t in enumerate(sampled)]


def test_sync_makes_vllm_sample_from_the_new_weights(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    from hubgym.rollout.engines import VLLMEngine
    from hubgym.train.sync import SYNC_ENGINE_ARGS, sync_weights

    engine = VLLMEngine(str(tiny_model), max_model_len=256, **SYNC_ENGINE_ARGS)
    try:
        ids = engine.tokenizer.encode("What is 2 + 3?")
        before_tokens, before = _vllm_logprobs(engine, ids)
        model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
        assert _hf_logprobs(model, ids, before_tokens) == pytest.approx(before, abs=1e-3)
        for version in (1, 2):
            torch.manual_seed(version)
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.05)
            seconds = sync_weights(engine, model.state_dict(), version, tmp_path / "sync")
            tokens, after = _vllm_logprobs(engine, ids)
            assert engine.policy_version == version and seconds > 0
            assert _hf_logprobs(model, ids, tokens) == pytest.approx(after, abs=1e-3)
            assert (tokens, after) != (before_tokens, before)
            before_tokens, before = tokens, after
    finally:
        engine.close()
