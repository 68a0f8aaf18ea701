"""vLLM's engine processes in tests.

On the CPU each engine spawns two processes (the engine core, then its worker) that import torch and vLLM again:
about 30 s of a 45 s start on 2 cores. conftest.py sets VLLM_ENABLE_V1_MULTIPROCESSING=0 (vLLM's own switch),
which runs the core in the calling process instead, 15 s a start (and HUBGYM_ENFORCE_EAGER=1: no torch.compile,
10-15 s less again). The tests that kill, reap or lose those processes prove the layout users get, whatever the
environment says: they ask for it with `ENGINE_PROCESSES` (a subprocess's env) or
`VLLMEngine(..., separate_core=True)`, as the trainer does (its process holds torch.distributed's group, which an
engine core beside it would take over).
"""

from __future__ import annotations

ENGINE_PROCESSES = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # for a subprocess's env: vLLM as users run it
