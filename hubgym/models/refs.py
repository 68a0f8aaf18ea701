"""Model references as commands and engines take them: 'tiny', a local model folder, or a Hub model id.

    resolve_model("tiny", setting="--model")     # the tiny local model's folder (written once, then reused)
    resolve_model("smollm2-135m")                # SmolLM2-135M-Instruct, converted once from its PyPI GGUF
    resolve_model("runs/m", setting="--model")   # "runs/m" if it holds config.json; else ModelNotFoundError
    context_length("runs/m", None)               # the model's own limit: max_position_embeddings in config.json
    context_length("runs/m", 8192)               # 8192, or ContextLengthError naming both numbers if it has fewer

A name that is no folder here and looks like `org/name[@revision]` is a Hub model: it resolves to its folder in
the Hugging Face cache (downloaded when online, read from the cache when offline), so engines, the trainer and
the token audit only ever see folders, and a typo or a missing offline copy fails at once with one line
instead of inside transformers or vLLM.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

from hubgym.errors import ContextLengthError, ModelNotFoundError

TINY = "tiny"
LOCAL_NAMES = (TINY, "smollm2-135m")  # models hubgym makes here: their names resolve to folders, never to the Hub
FALLBACK_CONTEXT = 4096  # when the model's config.json cannot be read (a Hub model not fetched here)
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


def resolve_model(model: str, *, setting: str = "--model", needs: tuple[str, ...] = ("config.json",)) -> str:
    """The folder (or Hub id) of `model`, checked: a folder must hold one of the files `needs` (a tokenizer
    alone does for a token audit); `setting` is how messages name where the model was given."""
    if model == TINY:
        from hubgym.models.tiny import default_tiny_model

        return str(default_tiny_model())
    if model == "smollm2-135m":
        from hubgym.models.smollm2 import smollm2_folder

        return str(smollm2_folder(setting=setting))
    fix = (f"give {setting} a model folder (config.json, weights and tokenizer, as save_pretrained writes them), "
           f"'tiny' for the tiny local model, 'smollm2-135m' for SmolLM2-135M-Instruct, or a Hub model id "
           f"org/name[@revision]")
    path = Path(model).expanduser()
    if path.is_dir() and any((path / name).is_file() for name in needs):
        return str(path)
    if path.exists():
        what = f"holds no {' or '.join(needs)}" if path.is_dir() else "is a file"
        raise ModelNotFoundError(f"{setting} {model}: the path {what}, so it is no model folder; {fix}",
                                 setting=setting, model=model)
    repo, _, revision = model.partition("@")
    if _HUB_ID.fullmatch(repo) and not Path(repo.split("/")[0]).is_dir():  # runs/m with runs/ here: a path
        return str(hub_model_folder(repo, revision or None, needs=needs, setting=setting, fix=fix))
    raise ModelNotFoundError(f"{setting} {model}: no such folder; {fix}", setting=setting, model=model)


WEIGHT_FILES = ["*.safetensors", "*.safetensors.index.json"]
SIDE_FILES = ["*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken"]  # config, tokenizer, template, vocab


def hub_model_folder(repo: str, revision: str | None, *, needs: tuple[str, ...] = ("config.json",),
                     setting: str = "--model", fix: str = "") -> Path:
    """The Hugging Face cache's snapshot folder of a Hub model (`org/name`, at `revision`, default main): read
    from the cache when offline (HF_HUB_OFFLINE=1), downloaded into it when online. Weights are fetched only when
    `needs` asks for config.json (a model to run); a tokenizer for the token audit needs the side files alone."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = SIDE_FILES + (WEIGHT_FILES if "config.json" in needs else [])
    name = f"{repo}@{revision}" if revision else repo
    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its retry notices would bury the one line this ends in
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except LocalEntryNotFoundError:
        raise ModelNotFoundError(f"{setting} {name}: the Hub cannot be reached (offline: HF_HUB_OFFLINE is set, or "
                                 f"no network) and the Hugging Face cache holds no copy of it; download it once "
                                 f"while online (`hf download {repo}`), or give a local model folder",
                                 setting=setting, model=name) from None
    except Exception as exc:  # not found, gated, a revision that does not exist: this model cannot load
        raise ModelNotFoundError(f"{setting} {name}: no Hub model {name} could be read ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:200]}); {fix}", setting=setting, model=name) from None
    finally:
        logger.setLevel(level)
    if not any((folder / n).is_file() for n in needs):
        raise ModelNotFoundError(f"{setting} {name}: its files hold no {' or '.join(needs)}, so it is no model; "
                                 f"{fix}", setting=setting, model=name)
    return folder


def model_positions(model: str) -> int | None:
    """max_position_embeddings from the model's config.json (a folder, or a Hub id's cached file); None if unknown."""
    config = Path(model) / "config.json"
    if not config.is_file():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, "config.json") if _HUB_ID.fullmatch(model) else None
        if not isinstance(cached, str):
            return None
        config = Path(cached)
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config") if isinstance(data.get("text_config"), dict) else {}
    value = data.get("max_position_embeddings", text.get("max_position_embeddings"))
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def context_length(model: str, asked: int | None, *, setting: str = "max_model_len") -> int:
    """The context length to run `model` with: `asked`, or the model's own limit when None (FALLBACK_CONTEXT
    if its config cannot be read). An `asked` past the model's limit is refused here, with one line, instead
    of inside vLLM's config validation."""
    own = model_positions(model)
    if asked is None:
        return own or FALLBACK_CONTEXT
    if own is not None and asked > own:
        raise ContextLengthError(f"{setting} {asked} is more than the {own} positions of the model {model} "
                                 f"(max_position_embeddings in its config.json); leave {setting} out to use {own}, "
                                 f"or give at most {own}", asked=asked, limit=own)
    return asked
