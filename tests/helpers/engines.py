"""vLLM's engine processes in tests.

By default each engine runs its core in a process of its own that imports torch and vLLM again (hubgym keeps the
model's worker inside it, on the CPU too: engines/offline.py). conftest.py sets VLLM_ENABLE_V1_MULTIPROCESSING=0
(vLLM's own switch), which runs the core in the calling process instead, about 10 s less a start on 2 cores (and
HUBGYM_ENFORCE_EAGER=1: no torch.compile, 10-15 s less again). The tests that kill, reap or lose those processes
prove the layout users get, whatever the environment says: they ask for it with `ENGINE_PROCESSES` (a subprocess's
env) or `VLLMEngine(..., separate_core=True)`, as the trainer does (its process holds torch.distributed's group,
which an engine core beside it would take over).
"""

from __future__ import annotations

import re

ENGINE_PROCESSES = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}  # for a subprocess's env: vLLM as users run it

# vLLM's own log lines, as `hubgym --verbose` shows them: "(EngineCore pid=12) INFO 11-25 ..." (the process's name)
VLLM_INFO = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) INFO ", re.M)
VLLM_WARNING = re.compile(r"^\((\w+)(?:-\d+)? pid=\d+\) WARNING ", re.M)
LOADING = "Loading safetensors checkpoint shards"  # vLLM's weight-loading bar, once per engine start and sync
