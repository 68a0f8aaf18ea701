"""The tiny model's folder appears whole or not at all, made once however many processes ask at once."""

import json
import multiprocessing

import pytest

from hubgym.models.tiny import TinyModelConfig, make_tiny_model

SMALL = TinyModelConfig(vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1)


def _make(out: str) -> None:
    make_tiny_model(out, SMALL)


@pytest.mark.slow
def test_processes_making_the_tiny_model_at_once_get_one_complete_folder(tmp_path):
    out = tmp_path / "tiny"
    procs = [multiprocessing.get_context("spawn").Process(target=_make, args=(str(out),)) for _ in range(3)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=300)
        assert proc.exitcode == 0
    assert json.loads((out / "hubgym_tiny_model.json").read_text()) == SMALL.__dict__
    assert {p.name for p in out.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert not (tmp_path / ".tiny.staging").exists()  # renamed into place, nothing left beside it


def test_a_half_written_folder_is_replaced_and_a_complete_one_reused(tmp_path):
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "config.json").write_text("{")  # a folder killed half way, before the staging folder existed
    make_tiny_model(out, SMALL)
    assert json.loads((out / "config.json").read_text())["vocab_size"] > 0
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    make_tiny_model(out, SMALL)
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp  # complete: reused, not rewritten
