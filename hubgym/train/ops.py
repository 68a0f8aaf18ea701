"""DeepSpeed's CPU op (the shared-memory comm op): built once, and never waited on after its builder died.

    python -m hubgym.train.ops        # build it now (`make setup` does), into $TORCH_EXTENSIONS_DIR

DeepSpeed JIT-compiles `deepspeed_shm_comm` the first time a process group starts on a CPU (about 80 s, then
cached in TORCH_EXTENSIONS_DIR, by default ~/.cache/hubgym/torch_extensions), under torch's build baton: the
file `<TORCH_EXTENSIONS_DIR>/deepspeed_shm_comm/lock`, created when a build starts and deleted when it ends. A
build that is killed leaves it behind, and every later process would wait on it forever, silently. Here the op
is loaded under a BatonWatch (hubgym.files.locks): a baton no live process holds open is removed, a wait longer than
a few seconds names the process building, and a load that waited on a build that then died builds it itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from hubgym.files.locks import BatonWatch

EXTENSIONS_DIR = Path("~/.cache/hubgym/torch_extensions")  # DeepSpeed's JIT ops (~80 s to build), built once


def extensions_dir() -> Path:
    """Where torch builds and caches extensions: $TORCH_EXTENSIONS_DIR, set to hubgym's cache when unset."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR.expanduser()))
    return Path(os.environ["TORCH_EXTENSIONS_DIR"])


def load_deepspeed_ops() -> bool:
    """Build (the first time) and load DeepSpeed's shm comm op, as its process group will; False where DeepSpeed
    uses none (a GPU, or a platform without it)."""
    root = extensions_dir()
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return False
    with BatonWatch(root / builder.NAME / "lock", f"DeepSpeed's {builder.NAME} op (built once, about 80 s)") as watch:
        try:
            builder.load(verbose=False)
        except (ImportError, OSError):
            if not watch.taken_over:
                raise
            builder.load(verbose=False)  # the build this process waited on died unfinished: build it here
    return True


if __name__ == "__main__":
    import logging
    import sys

    logging.getLogger("hubgym.files.locks").addHandler(logging.StreamHandler(sys.stderr))
    built = load_deepspeed_ops()
    print(f"DeepSpeed's CPU op is built in {extensions_dir()}" if built else "DeepSpeed needs no CPU op here")
