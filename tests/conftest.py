"""Shared test setup: offline Hub, private caches, and one tiny local model per test session."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# tests/helpers/ holds what several test modules share; its asserts get pytest's rewriting, as the tests' own do.
# Registered before anything imports the package (a module imported first could not be rewritten).
pytest.register_assert_rewrite("helpers")

pytest_plugins = ["helpers.hub_server"]  # the hub_server, hub_client and hub_spec fixtures

# The Hub is never reachable from tests; datasets writes lock files under HF_HOME even offline.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", str(Path(tempfile.gettempdir()) / f"hubgym-test-hf-{os.getpid()}"))
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM as tests start it, about 30 s sooner an engine on 2 cores: its core in the test's own process
# (VLLM_ENABLE_V1_MULTIPROCESSING=0: two processes fewer that import torch and vLLM again; helpers/engines.py says
# which tests keep the processes a user gets) and no torch.compile (HUBGYM_ENFORCE_EAGER=1: vllm.enforce_eager).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HUBGYM_ENFORCE_EAGER", "1")
# Each xdist worker (and what it starts) gets its share of the cores for torch's OpenMP threads. By default every
# process starts one per core, and idle ones spin: two workers on 2 cores each running 2 threads burned about 40% more
# CPU for the same training tests and took a fifth longer (set before anything imports torch, which reads it once).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _WORKERS)))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A tiny Qwen2-style chat model + tokenizer (deterministic, ~0.4M parameters): the one `--model tiny` uses,
    made once per machine in the hubgym cache under a lock, so workers and later runs share it. Read-only here."""
    from hubgym.models.tiny import default_tiny_model

    return default_tiny_model()


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct as a model folder: converted once into the hubgym cache (locked across workers)."""
    from hubgym.models.smollm2 import smollm2_folder

    return smollm2_folder(progress=False)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_model):
    """The real SmolLM2 tokenizer and ChatML template, loaded once per worker."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_model)


@pytest.fixture()
def cluster():
    """A real local Ray cluster (tests/helpers/ray_cluster.py: a head on 127.0.0.1), stopped after the test."""
    from helpers.ray_cluster import LocalRayCluster

    started = LocalRayCluster()
    yield started
    started.stop()


@pytest.fixture(scope="module", autouse=True)
def _no_training_group_left_behind():
    """A module that trained in this worker leaves hubgym's one-process training group (init_distributed) behind;
    every vLLM engine this worker starts later would then run its core in a process of its own (a core beside a
    group takes it over), about 10 s and one more torch-and-vLLM import a start. The group ends with its module;
    the next trainer starts a fresh one, as it does after anything else tore a group down. The launcher variables
    init_distributed set for it go too: a CLI subprocess or TRL started later would take them for a launcher's."""
    yield
    if "hubgym.train.engine" in sys.modules:
        from hubgym.train import engine

        if engine._OWN_GROUP and not engine._launched():
            engine.shutdown()
            for name in engine._OWN_GROUP:
                os.environ.pop(name, None)
            engine._OWN_GROUP.clear()
