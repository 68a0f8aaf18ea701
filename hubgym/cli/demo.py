"""`hubgym demo`: the main job (hubgym.app.pipeline) from the command line.

    hubgym demo --out out/demo                 # SmolLM2-135M-Instruct learns one-digit sums
    hubgym demo --model tiny                   # the tiny random model: the same pipeline in about 2 minutes
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hubgym.cli.app import Verbose, app, console, fail, user_errors


@app.command()
@user_errors
def demo(out: Annotated[Path, typer.Option(help="where everything the job makes is written (wiped first)")]
         = Path("out/demo"),
         max_rows: Annotated[int, typer.Option(min=1, help="rows per split to check")] = 100,
         env: Annotated[Optional[list[str]], typer.Option("--env", help="only check these envs (repeatable) "
                                                          "[default: every built-in]")] = None,
         model: Annotated[str, typer.Option(help="smollm2-135m (a pretrained model, converted from its PyPI GGUF) or "
                                                  "tiny (a random 0.4M-parameter model)")] = "smollm2-135m",
         offline_steps: Annotated[Optional[int], typer.Option(min=0, help="SFT steps on the stored rollouts' right "
                                                              "replies [default: 2 for smollm2-135m, 20 for tiny]")]
         = None,
         online_steps: Annotated[Optional[int], typer.Option(min=0, help="GRPO steps on fresh rollouts "
                                                             "[default: 4 for smollm2-135m, 100 for tiny]")] = None,
         verbose: Verbose = False) -> None:
    """The main job: model -> envs -> local hub -> vLLM rollouts -> re-score -> SFT, then GRPO -> report."""
    from hubgym.engines.vllm_logging import set_verbose

    set_verbose(verbose)
    from hubgym.app.pipeline import RECIPES, DemoSettings, run_demo

    if model not in RECIPES:
        fail(f"--model {model}: the demo trains one of {', '.join(RECIPES)}; for another model use `hubgym train` "
             f"with a config (`hubgym train --options` lists them)")
    settings = DemoSettings(out=out, model=model, check_envs=env, max_rows=max_rows, offline_steps=offline_steps,
                            online_steps=online_steps)
    report = run_demo(settings, console())
    if report.checks_failed:
        fail(f"{report.checks_failed} conformance checks failed (see above)")


