"""DeepSpeed's CPU op (the shared-memory comm op): built once, and never waited on after its builder died.

    python -m hubgym.train.ops        # build it now (`make setup` does), into $TORCH_EXTENSIONS_DIR

DeepSpeed JIT-compiles `deepspeed_shm_comm` the first time a process group starts on a CPU (about 80 s, then
cached in TORCH_EXTENSIONS_DIR, by default ~/.cache/hubgym/torch_extensions), under torch's build baton: the
file `<TORCH_EXTENSIONS_DIR>/deepspeed_shm_comm/lock`, created when a build starts and deleted when it ends. A
build that is killed leaves it behind, and every later process would wait on it forever, silently. Here the op
is loaded under a BatonWatch (hubgym.files.locks): a baton no live process holds open is removed, a wait longer than
a few seconds names the process building, and a load that waited on a build that then died builds it itself.

The op's buffers. When every rank runs on one machine (the deepspeed launcher's LOCAL_SIZE equals the world size),
each rank creates a shared-memory buffer of about 66 MB (`/dev/shm/deepspeed_allreduce_buffer_<uid>_<addr>_<port>_
<rank>`) and maps every rank's; DeepSpeed never unlinks them, so every such run, finished or killed, left them in
RAM until the machine restarted. `release_shm_names` unlinks each rank's own once all have mapped them: the memory
stays while a rank maps it and is freed when the last one exits, however it exits.
"""

from __future__ import annotations

import os
from pathlib import Path

from hubgym.files.locks import BatonWatch

EXTENSIONS_DIR = Path("~/.cache/hubgym/torch_extensions")  # DeepSpeed's JIT ops (~80 s to build), built once
SHM_FOLDER = Path("/dev/shm")  # where Linux keeps POSIX shared memory (shm_open's names)
SHM_BUFFER = "deepspeed_allreduce_buffer"  # the op's name prefix (deepspeed/ops/csrc/cpu/comm/shm.cpp)


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


def shm_buffer_path(rank: int) -> Path:
    """The shared-memory file of `rank`'s allreduce buffer, named as the op names it from the rendezvous."""
    addr, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return SHM_FOLDER / f"{SHM_BUFFER}_{os.getuid()}_{addr}_{port}_{rank}"


def uses_shm_buffers(world_size: int) -> bool:
    """Whether the op made buffers for this group: it does when every rank is local (LOCAL_SIZE == world size)."""
    return os.environ.get("LOCAL_SIZE") == str(world_size)


def release_shm_names(rank: int, world_size: int) -> None:
    """Unlink this rank's buffer name once every rank has mapped every buffer (the op maps them all while the
    group starts; the barrier waits until every rank is past that). Called by every rank, right after the group
    starts: the condition is the same on every rank, so all of them reach the barrier or none does."""
    if not uses_shm_buffers(world_size):
        return
    import torch.distributed

    torch.distributed.barrier()
    shm_buffer_path(rank).unlink(missing_ok=True)


if __name__ == "__main__":
    import logging
    import sys

    logging.getLogger("hubgym.files.locks").addHandler(logging.StreamHandler(sys.stderr))
    built = load_deepspeed_ops()
    print(f"DeepSpeed's CPU op is built in {extensions_dir()}" if built else "DeepSpeed needs no CPU op here")
