"""Training metrics: one global step for everything, written to a JSONL file, a console table and
(optionally) trackio, TensorBoard or W&B; curves saved as PNG.

    log = MetricsLog(out_dir, console=console, every=1, backends=["tensorboard"])
    log.log(step, {"policy/loss": 0.1, "env/arithmetic/reward": 0.4})
    log.lines                                  # records written so far: a checkpoint saves it...
    MetricsLog(out_dir, keep_lines=n)          # ...and a resumed run keeps that many, dropping what came after
    log.close()                                # writes metrics.png

Only rank 0 of a multi-process run logs (`enabled=False` elsewhere): the metrics are the same on every
rank, the policy numbers included (merge_metrics combines every micro-batch of every rank).

Policy metrics are token-weighted: a micro-batch's mean in group `g/` (policy/entropy, clip fractions,
IS ratio, KL) counts by that micro-batch's `g/tokens`, so a step's number is the mean over all of its
loss tokens, whatever the packing or the number of ranks, not a mean of per-micro-batch means.

Names are `group/[env/]metric`: `policy/*` (loss, clip fraction, KL, IS ratio, entropy, grad norm),
`env/<env>/*` (reward, components, success, failure rates, tokens), `eval/<env>/*`, `time/*`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from hubgym.files import atomic_write_bytes

CONSOLE_KEYS = ("policy/loss", "policy/grad_norm", "policy/clip_frac", "policy/is_ratio_mean", "policy/entropy",
                "sft/nll", "policy/staleness_max", "time/step_s", "time/tokens_per_s")


class MetricsLog:
    def __init__(self, out_dir: str | Path, *, console: Console | None = None, every: int = 1,
                 backends: list[str] | None = None, run_name: str = "hubgym", config: dict | None = None,
                 keep_lines: int | None = 0, enabled: bool = True):
        self.path = Path(out_dir) / "metrics.jsonl"
        self.console, self.every, self.enabled = console, every, enabled
        self.history = self._start(keep_lines) if enabled else []
        self._backends = [_open_backend(b, Path(out_dir), run_name, config or {})
                          for b in backends or []] if enabled else []

    @property
    def lines(self) -> int:
        return len(self.history)

    def _start(self, keep_lines: int | None) -> list[dict[str, Any]]:
        """The file starts with the first `keep_lines` records already there (what a resumed run's checkpoint
        had logged; a fresh run keeps none; None keeps all): records logged after that checkpoint are logged
        again as the resumed run redoes their steps, so they would otherwise appear twice."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = self.path.read_text().splitlines()[:keep_lines] if keep_lines != 0 and self.path.exists() else []
        atomic_write_bytes(self.path, "".join(line + "\n" for line in kept).encode())
        return [json.loads(line) for line in kept]

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record one step's metrics (several calls for one step merge in the file and plots)."""
        if not self.enabled:
            return
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self.history.append(record)
        with self.path.open("a") as f:  # appended line by line: a killed run keeps what it logged
            f.write(json.dumps(record) + "\n")
        for backend in self._backends:
            backend(step, metrics)
        if self.console is not None and step % self.every == 0 and any(k in metrics for k in CONSOLE_KEYS):
            self.console.print(step_table(step, metrics))

    def logged(self, step: int, prefix: str = "") -> dict[str, Any]:
        """The metrics recorded at `step` whose names start with `prefix` (e.g. a resumed run's first eval)."""
        return {k: v for r in self.history if r["step"] == step for k, v in r.items() if k.startswith(prefix)}

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["step"], r[key]) for r in self.history if key in r and r[key] is not None]

    def close(self, plot: bool = True) -> Path | None:
        for backend in self._backends:
            getattr(backend, "close", lambda: None)()
        return plot_curves(self.history, self.path.with_name("metrics.png")) if plot and self.history else None


def read_numbers(values: list[Any]) -> list[float]:
    """Numbers and 0-dim tensors as floats, the tensors read from their device in one copy: a step that
    kept its losses, checks and metrics on the GPU waits for it once, not once per value."""
    import torch

    tensors = [(i, v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    numbers = [float(v) if not isinstance(v, torch.Tensor) else 0.0 for v in values]
    if tensors:
        read = torch.stack([t.detach().reshape(()).to(torch.float64) for _, t in tensors]).tolist()
        for (i, _), value in zip(tensors, read):
            numbers[i] = value
    return numbers


def read_metrics(per_batch: list[dict[str, Any]]) -> list[dict[str, float]]:
    """The micro-batches' metrics (the loss's 0-dim device tensors) as floats, in one read."""
    values = read_numbers([v for m in per_batch for v in m.values()])
    out, at = [], 0
    for metrics in per_batch:
        out.append(dict(zip(metrics, values[at:at + len(metrics)])))
        at += len(metrics)
    return out


def merge_metrics(per_batch: list[dict[str, float]], reduce=None) -> dict[str, float]:
    """One step's metrics from those of its micro-batches: `*tokens`, `*_count`, `*sequences` add up, `*_max` is
    the largest over micro-batches with a token, and any other value is a mean weighted by its group's `g/tokens`
    (a plain mean over micro-batches where the group has no such count).

    `reduce(sums, maxima) -> (sums, maxima)` combines the partial sums and maxima of every rank (a sum and a max
    all-reduce); every rank must pass the same metric names.
    """
    keys = sorted({k for m in per_batch for k in m})
    sums: list[float] = []
    maxima: list[float] = []
    for key in keys:
        values = [(m[key], _weight(m, key)) for m in per_batch if key in m]
        if key.endswith(("_max", "/max")):  # micro-batches without a token (rank padding) have nothing to add
            maxima += [max((v for v, w in values if w > 0), default=-math.inf), max(v for v, _ in values)]
        elif key.endswith(("tokens", "_count", "sequences")):
            sums.append(sum(v for v, _ in values))
        else:  # weighted sum, total weight; plain sum, count (the value when no micro-batch has a token)
            sums += [sum(v * w for v, w in values), sum(w for _, w in values), sum(v for v, _ in values), len(values)]
    if reduce is not None:
        sums, maxima = reduce(sums, maxima)
    merged, s, m = {}, iter(sums), iter(maxima)
    for key in keys:
        if key.endswith(("_max", "/max")):
            nonempty, every = next(m), next(m)
            merged[key] = nonempty if nonempty > -math.inf else every
        elif key.endswith(("tokens", "_count", "sequences")):
            merged[key] = next(s)
        else:
            weighted, weight, plain, count = next(s), next(s), next(s), next(s)
            merged[key] = weighted / weight if weight > 0 else plain / count
    return merged


def _weight(metrics: dict[str, float], key: str) -> float:
    """What a micro-batch's mean `g/name` counts for: its `g/tokens`, or 1 when its group has no token count."""
    group = key.rpartition("/")[0]
    return float(metrics.get(f"{group}/tokens", 1.0)) if group else 1.0


def step_table(step: int, metrics: dict[str, float]) -> Table:
    """One compact row-per-env table for the console: rewards per env, then the policy numbers."""
    table = Table(title=f"step {step}", title_justify="left", show_edge=False)
    envs = sorted({k.split("/")[1] for k in metrics if k.startswith("env/")})
    table.add_column("env")
    for col in ("reward", "success", "truncated", "tokens"):
        table.add_column(col, justify="right")
    for env in envs:
        table.add_row(env, *(_fmt(metrics.get(f"env/{env}/{c}")) for c in ("reward", "success", "truncated", "tokens")))
    policy = "  ".join(f"{k.split('/', 1)[1]}={_fmt(metrics[k])}" for k in CONSOLE_KEYS if k in metrics)
    table.caption, table.caption_justify = policy, "left"
    return table


def plot_curves(history: list[dict[str, Any]], path: Path) -> Path:
    """Reward per env (train and eval) and the main policy numbers against the global step, with the step where
    the offline phase hands over to the online one marked on every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for r in history for k in r if k.endswith("/reward") and k.startswith(("env/", "eval/"))})
    policy = [k for k in ("policy/loss", "policy/grad_norm", "policy/is_ratio_mean", "policy/entropy", "sft/nll")
              if any(k in r for r in history)]
    fig, axes = plt.subplots(1 + len(policy), 1, figsize=(7, 2.6 * (1 + len(policy))), squeeze=False)
    for key in keys:
        points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
        axes[0][0].plot(*zip(*points), marker="o" if key.startswith("eval/") else None, markersize=4, label=key)
    axes[0][0].set_ylabel("mean reward (0-1)")
    axes[0][0].set_title("training run: rewards (train rows, held-out eval) and policy numbers", fontsize=9)
    axes[0][0].legend(fontsize=7)
    for ax, key in zip(axes[1:], policy):
        points = [(r["step"], r[key]) for r in history if r.get(key) is not None]
        ax[0].plot(*zip(*points), marker="." if len(points) < 3 else None)
        ax[0].set_ylabel(key.split("/", 1)[1] + (" (nats/token)" if key.endswith(("entropy", "nll")) else ""))
    online = next((r["step"] for r in history if r.get("train/phase") == 1), None)
    if online is not None and any(r.get("train/phase") == 0 for r in history):
        for ax in axes[:, 0]:
            ax.axvline(online - 0.5, color="grey", lw=0.8, ls="--")
        axes[0][0].text(online - 0.5, 1.0, " offline | online ", ha="center", va="bottom", fontsize=7, color="grey",
                        transform=axes[0][0].get_xaxis_transform())
    axes[-1][0].set_xlabel("global step (optimizer steps)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _open_backend(name: str, out_dir: Path, run_name: str, config: dict):
    """trackio / tensorboard / wandb, imported only when asked for, with an install hint if missing."""
    try:
        if name == "tensorboard":
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(str(out_dir / "tensorboard"))
            log = lambda step, m: [writer.add_scalar(k, v, step) for k, v in m.items() if _finite(v)]  # noqa: E731
            log.close = writer.close  # type: ignore[attr-defined]
            return log
        if name in ("trackio", "wandb"):
            module = __import__(name)
            run = module.init(project="hubgym", name=run_name, config=config)
            log = lambda step, m: module.log({k: v for k, v in m.items() if _finite(v)}, step=step)  # noqa: E731
            log.close = getattr(run, "finish", None) or module.finish  # type: ignore[attr-defined]
            return log
    except ImportError as exc:
        raise ImportError(f"logging to {name} needs its package: pip install {name} ({exc})") from None
    raise ValueError(f"unknown metrics backend {name!r}; use trackio, tensorboard or wandb")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
