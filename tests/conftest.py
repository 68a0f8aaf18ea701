"""Shared test setup: offline Hub, private caches, and one tiny local model per test session."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# The Hub is never reachable from tests; datasets writes lock files under HF_HOME even offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", str(Path(tempfile.gettempdir()) / f"hubgym-test-hf-{os.getpid()}"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny Qwen2-style chat model + tokenizer written locally (deterministic, ~0.4M parameters)."""
    from hubgym.rollout.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))
