"""`hubgym eval`: a model's held-out score on envs, with a confidence interval, as training measures it.

    hubgym eval arithmetic:sums --model smollm2-135m --n 8
    hubgym eval arithmetic:sums --model runs/smollm2-sums/model --n 8   # the trained model, same tasks

It samples each env's held-out split with vLLM (a normal rollout run under --out, so `hubgym report`
reads it) and prints the mean reward with the half-width of its 95% interval, task-clustered: the
numbers `hubgym train` logs as eval/<env>/*, so a model before and after training compares directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from hubgym.cli.app import HUB_HELP, Verbose, app, console, user_errors
from hubgym.envs.pins import PIN_HELP, parse_pins


@app.command("eval")
@user_errors
def evaluate_model(
    envs: Annotated[list[str], typer.Argument(help="envs ENV[:CONFIG] (names, folders or hub refs)")],
    model: Annotated[str, typer.Option(help="model folder, 'tiny', 'smollm2-135m' or a Hub id org/name[@rev]")]
    = "tiny",
    split: Annotated[str, typer.Option(help="the held-out split")] = "test",
    limit: Annotated[int, typer.Option(min=1, help="tasks per env")] = 32,
    n: Annotated[int, typer.Option(min=1, help="samples per task (pass@k uses them)")] = 8,
    temperature: Annotated[float, typer.Option(min=0.0)] = 1.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="tokens per turn")] = 1024,
    max_model_len: Annotated[Optional[int], typer.Option(help="context length [default: the model's own]")] = None,
    seed: int = 0,
    out: Annotated[Path, typer.Option(help="where the evaluation rollouts are written")] = Path("runs/eval"),
    hub: Annotated[Optional[str], typer.Option(help=HUB_HELP)] = None,
    trust: Annotated[bool, typer.Option(help="run hub envs' verifiers unpinned")] = False,
    pin: Annotated[Optional[list[str]], typer.Option(help=PIN_HELP)] = None,
    verbose: Verbose = False,
) -> None:
    """Held-out reward of a model on envs: mean, 95% interval (task-clustered), pass@1 and pass@k."""
    from hubgym.engines.vllm_logging import set_verbose

    set_verbose(verbose)
    from hubgym.models import context_length, resolve_model
    from hubgym.engines import make_engine
    from hubgym.rollout.run import check_at_most
    from hubgym.train.evaluate import evaluate

    check_at_most("n", n)  # before the engine starts
    folder = resolve_model(model, setting="--model")
    length = context_length(folder, max_model_len, setting="--max-model-len")
    engine = make_engine("vllm", folder, max_model_len=length, seed=seed)
    try:
        metrics = evaluate(engine, envs, model=folder, out=out, step=0, split=split, limit=limit, n=n,
                           temperature=temperature, max_tokens=max_tokens, seed=seed, max_model_len=length,
                           hub=hub, trust=trust, pins=parse_pins(pin))
    finally:
        engine.close()
    console().print(eval_table(metrics, title=f"{model} on the {split} split ({n} samples per task): {out}"))


def eval_table(metrics: dict[str, float], title: str) -> Table:
    """One row per env from eval/<env>/<metric> keys."""
    table = Table("env", "reward", "95% interval", "pass@1", "pass@k", "truncated", title=title, box=None)
    envs = sorted({key.split("/")[1] for key in metrics})
    for env in envs:
        value = {name: metrics.get(f"eval/{env}/{name}") for name in
                 ("reward", "reward_ci95", "pass@1", "pass@k", "truncated")}
        low_high = (f"{value['reward'] - value['reward_ci95']:.3f} - {value['reward'] + value['reward_ci95']:.3f}"
                    if value["reward"] is not None and value["reward_ci95"] is not None else "-")
        table.add_row(env, *(f"{v:.3f}" if v is not None else "-" for v in (value["reward"],)), low_high,
                      *(f"{value[k]:.3f}" if value[k] is not None else "-" for k in ("pass@1", "pass@k", "truncated")))
    return table
