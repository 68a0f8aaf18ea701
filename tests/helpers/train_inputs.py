"""Inputs of the loss and packing tests: a SmolLM2-shaped Llama at a tiny size, and groups of varied lengths."""

from __future__ import annotations

import torch

from hubgym.train.groups import Group


def small_llama(vocab: int = 96):
    """A SmolLM2-shaped (Llama, tied embeddings, head_dim 64, grouped KV heads) model at a tiny size."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, vocab_size=vocab,
                                  tie_word_embeddings=True, rope_theta=1e5, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def varied_groups(vocab: int) -> list[Group]:
    """4 groups of 3 sequences, 5 to 40 tokens: short ones fit beside long ones."""
    gen = torch.Generator().manual_seed(3)
    groups = []
    for g, (prompt, longest) in enumerate([(3, 37), (5, 12), (2, 6), (4, 25)]):
        rows = []
        for s in range(3):
            c = max(1, longest - 9 * s)
            ids = torch.randint(0, vocab, (prompt + c,), generator=gen).tolist()
            rows.append({"rollout_id": f"{g}-{s}", "prompt_ids": ids[:prompt], "completion_ids": ids[prompt:],
                         "completion_mask": [int(i % 5 != 3) for i in range(c)],
                         "completion_logprobs": (-torch.rand(c, generator=gen) * 3).tolist()})
        groups.append(Group("e", f"g{g}", rows, [1.0, -0.5, -0.5] if g % 2 else [-1.0, 0.25, 0.75], 1.0,
                            [False] * 3))
    return groups
