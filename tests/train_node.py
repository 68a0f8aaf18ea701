"""`hubgym train` as a launcher starts it, with one fault to inject, for tests/test_train_nodes.py.

    torchrun --nnodes 2 --node_rank 1 ... tests/train_node.py [--die-after-checkpoint STEP] train CONFIG --set ...

--die-after-checkpoint STEP: the process of global rank 1 SIGKILLs itself right after the checkpoint of STEP is
complete (a worker that dies mid-run, at a known point, so the test is not a race against a clock). Everything
else is the real command: the arguments after the options go to hubgym's own CLI.
"""

from __future__ import annotations

import os
import signal
import sys


def die_after_checkpoint(step: int) -> None:
    """Wrap save_checkpoint (the trainer imports it when it saves) so that rank 1 dies once `step` is saved."""
    from hubgym.train import checkpoint

    save = checkpoint.save_checkpoint

    def save_then_die(policy, root, saved_step, *args, **kwargs):
        path = save(policy, root, saved_step, *args, **kwargs)
        if policy.rank == 1 and saved_step == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    checkpoint.save_checkpoint = save_then_die


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--die-after-checkpoint"]:
        die_after_checkpoint(int(args[1]))
        args = args[2:]
    from hubgym.cli import main as hubgym

    sys.argv = ["hubgym", *args]
    hubgym()


if __name__ == "__main__":
    main()
