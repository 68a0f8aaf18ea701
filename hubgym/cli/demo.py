"""`hubgym demo`: the main job (hubgym.pipeline) from the command line.

    hubgym demo --out out/demo
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
         offline_steps: Annotated[int, typer.Option(min=0, help="GRPO steps on the stored rollouts")] = 20,
         online_steps: Annotated[int, typer.Option(min=0, help="GRPO steps on fresh rollouts")] = 100,
         verbose: Verbose = False) -> None:
    """The main job: tiny model -> envs -> local hub -> vLLM rollouts -> re-score -> GRPO -> report."""
    from hubgym.rollout.vllm_logging import set_verbose

    set_verbose(verbose)
    from hubgym.pipeline import DemoSettings, run_demo

    settings = DemoSettings(out=out, check_envs=env, max_rows=max_rows, offline_steps=offline_steps,
                            online_steps=online_steps)
    report = run_demo(settings, console())
    if report.checks_failed:
        fail(f"{report.checks_failed} conformance checks failed (see above)")


