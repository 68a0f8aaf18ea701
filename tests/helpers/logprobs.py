"""The tiny model's logprobs as vLLM serves them and as Hugging Face computes them, and a moved copy of it."""

from __future__ import annotations

import torch

TOL = 1e-3  # float32 on both sides; vLLM's CPU kernels differ from torch's in the last bits


def perturbed(tiny_model, seed: int, scale: float = 0.05):
    """The tiny model as Hugging Face loads it, every parameter moved by noise (a stand-in for a train step)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    if seed:
        torch.manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * scale)
    return model.eval()


def vllm_logprobs(engine, ids: list[int], max_tokens: int = 6) -> tuple[list[float], list[int], list[float], object]:
    """Greedy: (prompt logprobs of ids[1:], sampled tokens, their logprobs, the completion)."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=0, prompt_logprobs=0, ignore_eos=True)
    out = engine.llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
    prompt_lp = [entry[t].logprob for t, entry in zip(ids[1:], out.prompt_logprobs[1:])]
    done = out.outputs[0]
    return prompt_lp, list(done.token_ids), [e[t].logprob for t, e in zip(done.token_ids, done.logprobs)], done


def hf_logprobs(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    return [logprobs[i, t].item() for i, t in enumerate(ids[1:])]
