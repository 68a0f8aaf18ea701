"""vLLM engine settings (train config section `vllm`, `hubgym rollout` options): each value vLLM would refuse is
one line naming the setting, before vLLM starts; dtype auto keeps float32 on a CPU; bfloat16 runs on this CPU."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys

import pytest

from hubgym.errors import EngineError
from hubgym.engines import EngineSettings, Request, SamplingArgs, VLLMEngine
from hubgym.rollout import RolloutConfig
from hubgym.rollout.options import with_options
from hubgym.train.config import TINY_CONFIG, ConfigError, load_config

ON_CPU = not __import__("torch").cuda.is_available()


def test_defaults_fit_a_trainer_beside_vllm():
    v = load_config(TINY_CONFIG).vllm
    assert (v.engine, v.dtype, v.gpu_memory_utilization, v.tensor_parallel_size, v.enable_sleep_mode) == \
        ("local", "auto", 0.3, 1, False)


@pytest.mark.parametrize("override, message", [
    ("vllm.gpu_memory_utilization=1.5", r"vllm.gpu_memory_utilization=1.5 must be <= 1"),
    ("vllm.gpu_memory_utilization=0", r"vllm.gpu_memory_utilization=0 must be > 0"),
    ("vllm.tensor_parallel_size=0", r"vllm.tensor_parallel_size=0 must be >= 1"),
    ("vllm.dtype=int8", r"vllm.dtype: Input should be 'auto', 'bfloat16', 'float16' or 'float32'"),
    ("vllm.engine=server", r"vllm.engine=server needs vllm.base_url"),
])
def test_bad_values_are_refused_when_the_config_loads(override, message):
    with pytest.raises(ConfigError, match=message) as info:
        load_config(TINY_CONFIG, [override])
    assert "\n" not in str(info.value)


def test_a_server_run_refuses_local_engine_settings():
    """A server has its own dtype and memory share: a trainer-side value would be silently ignored."""
    with pytest.raises(ConfigError, match=r"vllm.dtype sets the trainer's own vLLM engine.*--dtype"):
        load_config(TINY_CONFIG, ["vllm.engine=server", "vllm.base_url=http://127.0.0.1:8000/v1",
                                  "vllm.dtype=bfloat16"])
    cfg = load_config(TINY_CONFIG, ["vllm.engine=server", "vllm.base_url=http://127.0.0.1:8000/v1"])
    assert cfg.vllm.weight_transfer == "file"


@pytest.mark.skipif(not ON_CPU, reason="the CPU backend's rules")
def test_auto_keeps_float32_on_a_cpu():
    assert EngineSettings(dtype="auto").vllm_args()["dtype"] == "float32"
    assert EngineSettings(dtype="bfloat16").vllm_args()["dtype"] == "bfloat16"


def test_enforce_eager_is_a_setting_and_the_environment_can_ask_it_of_every_engine(monkeypatch):
    """vllm.enforce_eager in a train config, `--set vllm.enforce_eager=true` in a rollout, or HUBGYM_ENFORCE_EAGER=1
    (which the suite sets) all reach vLLM as enforce_eager; with none of them vLLM compiles as it chooses."""
    monkeypatch.delenv("HUBGYM_ENFORCE_EAGER", raising=False)
    assert "enforce_eager" not in EngineSettings().vllm_args()
    assert EngineSettings(enforce_eager=True).vllm_args()["enforce_eager"] is True
    assert load_config(TINY_CONFIG, ["vllm.enforce_eager=true"]).vllm.engine_settings().enforce_eager
    plain = RolloutConfig(envs=["arithmetic"], model="m", out="o")
    assert with_options(plain, ["vllm.enforce_eager=true"]).vllm == EngineSettings(enforce_eager=True)
    assert RolloutConfig(envs=["arithmetic"], model="m", out="o",
                         vllm=EngineSettings(enforce_eager=True)).run_id() != RolloutConfig(
        envs=["arithmetic"], model="m", out="o").run_id()  # a setting of the run: part of its id
    monkeypatch.setenv("HUBGYM_ENFORCE_EAGER", "1")
    assert EngineSettings().vllm_args()["enforce_eager"] is True


@pytest.mark.skipif(not ON_CPU, reason="the CPU backend's rules")
@pytest.mark.parametrize("kwargs, message", [
    ({"tensor_parallel_size": 2}, r"vllm.tensor_parallel_size=2 needs that many GPUs, but this machine has no GPU"),
    ({"enable_sleep_mode": True}, r"vllm.enable_sleep_mode: vLLM's cpu backend has no sleep mode"),
    ({"gpu_memory_utilization": 1.2}, r"vllm.gpu_memory_utilization=1.2 must be in \(0, 1\]"),
])
def test_what_this_machine_cannot_run_is_refused_before_vllm_starts(tiny_model, kwargs, message):
    with pytest.raises(EngineError, match=message):
        VLLMEngine(str(tiny_model), max_model_len=256, settings=EngineSettings(**kwargs))


def test_the_cli_names_its_options():
    with pytest.raises(EngineError, match=r"^--tensor-parallel-size=3 needs"):
        EngineSettings(tensor_parallel_size=3 if ON_CPU else 10_000).check(setting="--")


@pytest.mark.slow
@pytest.mark.skipif(not ON_CPU, reason="measured on the CPU backend")
def test_bfloat16_runs_on_this_cpu(tiny_model):
    """vLLM's CPU backend computes in bfloat16 here (AVX2, no native bf16): the engine samples with finite logprobs."""
    engine = VLLMEngine(str(tiny_model), max_model_len=256, settings=EngineSettings(dtype="bfloat16"),
                        enforce_eager=True)
    try:
        assert str(engine.llm.llm_engine.model_config.dtype) == "torch.bfloat16"
        request = Request(ids=[1, 7, 42, 99], messages=[], tools=None, n=2, max_tokens=6, seed=0)
        samples = asyncio.run(engine.generate(request, SamplingArgs(temperature=1.0, max_tokens=6)))
    finally:
        engine.close()
    assert len(samples) == 2
    for sample in samples:
        assert 0 < len(sample.token_ids) == len(sample.logprobs)
        assert all(math.isfinite(lp) and lp <= 0 for lp in sample.logprobs)



ONE_PROCESS_GROUP = r"""
import gc
import os
import torch.distributed as dist
from vllm.distributed.parallel_state import model_parallel_is_initialized
from hubgym.engines import VLLMEngine
from hubgym.train.engine import init_distributed

def core(engine):
    return type(engine.llm.llm_engine.engine_core).__name__

def mark_the_core(worker, folder):  # in the core's process: an exit handler leaves a file, a finalizer another
    import atexit, builtins, os

    class TornDown:
        def __del__(self, _open=open, _path=os.path.join(folder, "torn down")):
            _open(_path, "w").close()

    atexit.register(lambda: open(os.path.join(folder, "exit handlers ran"), "w").close())
    builtins.hubgym_test_marker = TornDown()

def vllm_processes():
    import psutil
    names = [" ".join(p.cmdline()).strip() for p in psutil.Process().children(recursive=True)]
    return sorted(name for name in names if name.startswith("VLLM") or "spawn_main" in name)

if __name__ == "__main__":
    import sys
    engine = VLLMEngine(sys.argv[1], max_model_len=256, enforce_eager=True)
    print("alone:", core(engine), dist.is_initialized(), gc.get_freeze_count() > 0)  # vLLM froze the heap
    engine.close()
    print("closed:", dist.is_initialized(), gc.get_freeze_count())
    dropped = VLLMEngine(sys.argv[1], max_model_len=256, enforce_eager=True)
    dropped.cycle = dropped  # never closed and held by a cycle: vLLM's finalizer runs when the collector gets to it
    del dropped
    engine = VLLMEngine(sys.argv[1], max_model_len=256, enforce_eager=True)
    gc.unfreeze()  # as the next close() of any engine does
    gc.collect()
    print("after a dropped engine:", core(engine), model_parallel_is_initialized())
    engine.close()
    init_distributed()  # a trainer's group, then an engine beside it
    engine = VLLMEngine(sys.argv[1], max_model_len=256, enforce_eager=True)
    print("beside a group:", core(engine), vllm_processes(), gc.get_freeze_count())  # this heap given back
    engine.llm.collective_rpc(mark_the_core, args=(sys.argv[2],))
    core_process, = engine.llm.llm_engine.engine_core.resources.engine_manager.processes
    engine.close()
    print("group kept:", dist.is_initialized())
    print("core left:", core_process.exitcode, sorted(os.listdir(sys.argv[2])))
"""


@pytest.mark.slow
def test_an_engine_core_runs_in_this_process_only_where_no_process_group_is(tiny_model, tmp_path):
    """With VLLM_ENABLE_V1_MULTIPROCESSING=0 a core in this process joins torch.distributed's global group: it
    leaves it when the engine closes (a trainer started next starts clean), an engine dropped without closing is
    collected before the next core starts (not torn down later, under it), and where this process is in a group
    already (a trainer's) the core runs in a process of its own, the model's worker inside it (on the CPU too, where
    vLLM would start the worker in a third process), and the group outlives the engine. The heap this process froze
    while an engine started (hubgym.engines.offline._frozen_heap) is frozen after the start only where vLLM froze it
    itself (a core in this process, until it closes). A core in its own process leaves as a forked one does: its
    exit handlers run, Python's teardown (3 s of garbage collection there, which close() waits for) does not."""
    script = tmp_path / "one_group.py"
    script.write_text(ONE_PROCESS_GROUP)
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")  # a trainer's, in this worker
    env = {**{k: v for k, v in os.environ.items() if k not in launcher}, "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
           "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}  # a function of this test runs in the core (mark_the_core)
    marks = tmp_path / "marks"
    marks.mkdir()
    done = subprocess.run([sys.executable, str(script), str(tiny_model), str(marks)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    phases = ("alone", "closed", "after a dropped engine", "beside a group", "group kept", "core left")
    lines = [line for line in done.stdout.splitlines() if line.split(":")[0] in phases]
    assert lines == ["alone: InprocClient True True", "closed: False 0", "after a dropped engine: InprocClient True",
                     "beside a group: SyncMPClient ['VLLM::EngineCore'] 0", "group kept: True",
                     "core left: 0 ['exit handlers ran']"], done.stdout[-2000:]


def test_on_a_cpu_engines_use_the_compile_cache_that_loads_unless_the_user_chose(monkeypatch, tmp_path):
    """vLLM's AOT compile artifacts fail to load on its CPU backend (every start compiled again): the offline
    engine's process and a `vllm serve` hubgym starts get VLLM_USE_AOT_COMPILE=0 there; a value the user set stays."""
    from hubgym.engines.server import VLLMServer
    from hubgym.engines.settings import compile_cache_env

    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    expected = {"VLLM_USE_AOT_COMPILE": "0"} if ON_CPU else {}
    assert compile_cache_env() == expected
    server = VLLMServer(tmp_path / "model", log_path=tmp_path / "log")
    assert server.environment().get("VLLM_USE_AOT_COMPILE") == expected.get("VLLM_USE_AOT_COMPILE")
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert compile_cache_env() == {} and server.environment()["VLLM_USE_AOT_COMPILE"] == "1"
