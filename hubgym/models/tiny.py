"""Write a tiny, randomly initialized Qwen2-style chat model + tokenizer, deterministically.

No weights can be downloaded on an offline machine, so tests, benchmarks and the demo make
their own model: a byte-level BPE tokenizer trained on a fixed corpus, a Hermes/Qwen-style
chat template with tool calls, and a 2-layer Qwen2 with head_dim 32 (the CPU attention
kernels of vLLM need head_dim in {32, 64, 80, ...}). Same seed => byte-identical files.

    python -m hubgym.models.tiny OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TAG_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>"]
"""Single tokens that stay visible in decoded text (not special), as in Qwen's tokenizer, so parsers see them."""
TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape of the tiny model: ~0.4M parameters, fast enough to sample and train on 2 CPU cores."""

    vocab_size: int = 1024  # BPE vocabulary, before the tag tokens
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4  # head_dim = 128 / 4 = 32
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    seed: int = 0


def _corpus() -> list[str]:
    """A fixed training corpus: chat scaffolding, digits and arithmetic, tool-call JSON, common words."""
    words = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
             "word but not what all were we when your can said there use an each which she do how their if will up "
             "other about out many then them these so some her would make like him into time has look two more write "
             "go see number no way could people my than first water been call who oil its now find long down day did "
             "get come made may part answer reverse text guess board move order cancel return address user assistant "
             "system tool calculator python expression result error wordle crane slate green yellow gray").split()
    lines = [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    lines += [f"What is {a} + {b}? <answer>{a + b}</answer>" for a in range(0, 100, 7) for b in range(0, 100, 11)]
    lines += ['<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>',
              "<tool_response>\n408\n</tool_response>", "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"]
    return lines * 4


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                      bos_token=None, unk_token=None, chat_template=TEMPLATE_PATH.read_text(),
                                      model_max_length=4096, clean_up_tokenization_spaces=False)
    wrapped.add_tokens(TAG_TOKENS)
    return wrapped


def make_tiny_model(out_dir: str | Path, config: TinyModelConfig = TinyModelConfig()) -> Path:
    """Write model + tokenizer to `out_dir` and return it. Reuses a complete folder as is.

    Safe with several processes at once (the ranks of a node, Ray workers on one machine): one makes the
    folder under a file lock beside it, in a staging folder renamed into place, so nobody ever reads a
    half-written model and a process killed while writing leaves only its staging folder (removed next time).
    """
    from hubgym.files.locks import exclusive

    out = Path(out_dir)
    if _complete(out, config):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(out.parent / f".{out.name}.lock", f"the tiny model being written to {out}"):
        if _complete(out, config):  # another process made it while this one waited
            return out
        staging = out.parent / f".{out.name}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        _write_tiny_model(staging, config)
        shutil.rmtree(out, ignore_errors=True)  # an older config's folder, or one from before staging existed
        staging.rename(out)
    return out


def _complete(out: Path, config: TinyModelConfig) -> bool:
    marker = out / "hubgym_tiny_model.json"
    try:
        return json.loads(marker.read_text()) == config.__dict__
    except (OSError, ValueError):
        return False


def _write_tiny_model(out: Path, config: TinyModelConfig) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _train_tokenizer(config.vocab_size)
    torch.manual_seed(config.seed)
    model_config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None, torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(model_config)
    out.mkdir(parents=True)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "hubgym_tiny_model.json").write_text(json.dumps(config.__dict__))


def default_tiny_model() -> Path:
    """The tiny model in the user cache (`$HUBGYM_CACHE`, default ~/.cache/hubgym), made on first use."""
    cache = Path(os.environ.get("HUBGYM_CACHE", Path.home() / ".cache" / "hubgym"))
    return make_tiny_model(cache / "tiny-model")


if __name__ == "__main__":
    print(make_tiny_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-model"))
