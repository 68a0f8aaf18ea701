"""bench/bench_mfu.py, the GPU benchmark's one script, runs end to end on the CPU at a tiny size (so it cannot rot
between the rare runs on a GPU), and its 1.5B preset has Qwen2.5-1.5B's size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
def test_bench_mfu_runs_on_the_cpu_and_hubgym_peaks_below_the_bare_loop(tmp_path):
    """A vocabulary of 49,152 at 1,024-token micro-batches: the bare loop's float32 logits (192 MiB, plus their
    log-softmax and gradients) set its peak; hubgym's chunked output layer never holds them."""
    out = tmp_path / "mfu.json"
    subprocess.run([sys.executable, str(BENCH / "bench_mfu.py"), "--device", "cpu", "--preset", "tiny-49k",
                    "--seq-len", "256", "--sequences", "8", "--n", "4", "--budget", "1024", "--steps", "1",
                    "--profile", "--no-write", "--json", str(out)], check=True, capture_output=True)
    [result] = json.loads(out.read_text())["results"]
    bare, hubgym = result["sides"]["bare"], result["sides"]["hubgym"]
    assert result["micro_batches"] == 2 and bare["tokens"] == hubgym["tokens"] == 8 * 256
    assert bare["tokens_s"] > 0 and hubgym["tokens_s"] > 0 and bare["mfu"] is None  # no peak FLOP/s on a CPU
    assert hubgym["kernels"] > 0 and bare["kernels"] > 0  # aten operators per step, from the profiler
    assert 0 < hubgym["peak_memory_gib"] < bare["peak_memory_gib"], (hubgym, bare)
    shown = subprocess.run([sys.executable, str(BENCH / "bench_mfu.py"), "--from-json", str(out), "--no-write"],
                           check=True, capture_output=True, text=True).stdout  # a GPU run's file, shown here
    assert "tiny-49k" in shown and "hubgym" in shown and "aten ops / step" in shown


def test_the_qwen25_preset_has_qwen25_15bs_size():
    """Qwen2.5-1.5B: 1.54B parameters, 1.31B of them outside the (tied) embedding, as its model card says."""
    sys.path.insert(0, str(BENCH))
    try:
        import bench_mfu
    finally:
        sys.path.remove(str(BENCH))
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, values = bench_mfu.PRESETS["qwen2.5-1.5b"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **values))
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight.numel()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert round(total / 1e9, 2) == 1.54 and round((total - embedding) / 1e9, 2) == 1.31
