"""The PNG of `hubgym report`: three panels of the per-env summary that hubgym.hub.rollout_stats computes.

    plot_rewards(scan_rollouts(["runs/r1"]), "runs/r1/report.png")
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from hubgym.hub.rollout_stats import SCORED, reward_components, summarize
from hubgym.schemas.text import plain


def plot_rewards(rollouts: pl.LazyFrame, path: str | Path, k: int | None = None) -> Path:
    """`reward_figure` saved as PNG."""
    import matplotlib.pyplot as plt

    fig = reward_figure(rollouts, k)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def reward_figure(rollouts: pl.LazyFrame, k: int | None = None):
    """Three panels, one column of marks per env: how many rows earned each reward (readable when every reward
    is equal), the rates of the summary (pass@1, pass@k, no answer, errors, truncated), and the mean of each
    reward component. Returns the matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = summarize(rollouts, k)
    envs = table["env"].to_list()
    counts = (rollouts.filter(SCORED).group_by("env", pl.col("reward").round(3))
              .agg(pl.len().alias("rows")).collect())
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(max(11.0, 3.6 * len(envs) + 4.5), 4.2))
    _plot_counts(left, envs, table, counts)
    _plot_rates(middle, envs, table)
    _plot_components(right, envs, reward_components(rollouts))
    fig.suptitle("rollouts per environment", fontsize=11)
    fig.tight_layout()
    return fig


def _env_axis(ax, envs: list[str], labels: list[str] | None = None) -> None:
    ax.set_xticks(range(len(envs)), labels or [plain(env) for env in envs], fontsize=8)
    ax.set_xlim(-0.7, len(envs) - 0.3)


def _plot_counts(ax, envs: list[str], table: pl.DataFrame, counts: pl.DataFrame) -> None:
    """Each distinct reward as a dot whose area is its share of the env's scored rows, labelled with its count."""
    for i, env in enumerate(envs):
        part = counts.filter(pl.col("env") == env).sort("reward")
        total = max(part["rows"].sum(), 1)
        sizes = [30 + 600 * r / total for r in part["rows"]]
        ax.scatter([i] * len(part), _drawable(part["reward"]), s=sizes, alpha=0.6)
        if len(part) <= 8:  # a few distinct rewards: say how many rows earned each
            for reward, rows in part.select("reward", "rows").iter_rows():
                ax.annotate(f"{rows}", (i, _drawable([reward])[0]), xytext=(9, -3), textcoords="offset points",
                            fontsize=7)
    labels = [f"{plain(r['env'])}\n{r['rollouts']} rows, {r['groups']} groups\n"
              f"{round(r['errors'] * r['rollouts'])} errors" for r in table.iter_rows(named=True)]
    _env_axis(ax, envs, labels)
    _pad(ax, counts["reward"].to_list(), 0.15)
    ax.set_ylabel("reward")
    ax.set_title("rows per reward (scored rows)", fontsize=9)


DRAWN = 1e300
"""The largest magnitude drawn: a value past it is drawn at it (its label keeps the value). An axis spanning
more than the largest float cannot be laid out (its width overflows to inf)."""


def _drawable(values) -> list[float]:
    """Values as drawn: finite ones clipped to +-DRAWN, NaN kept (matplotlib leaves it out), +-inf at +-DRAWN."""
    array = np.asarray(list(values), dtype=np.float64)
    return np.clip(np.nan_to_num(array, nan=np.nan, posinf=DRAWN, neginf=-DRAWN), -DRAWN, DRAWN).tolist()


def _pad(ax, values, share: float) -> None:
    """y limits around the drawn values with `share` of their span as margin (at least 0.5 around a single value),
    computed so that nothing overflows."""
    drawn = [v for v in _drawable(values) if np.isfinite(v)]
    if not drawn:
        return
    low, high = min(drawn), max(drawn)
    pad = max(high * share - low * share, 0.5 if high == low else 0.0)  # no (high - low): it may overflow
    ax.set_ylim(max(low - pad, -1.5 * DRAWN), min(high + pad, 1.5 * DRAWN))


RATES = [("pass@1", "pass@1"), ("pass@k", "pass@k"), ("no_answer", "no answer"), ("errors", "errors"),
         ("truncated", "truncated")]


def _plot_rates(ax, envs: list[str], table: pl.DataFrame) -> None:
    width = 0.8 / len(RATES)
    for j, (column, label) in enumerate(RATES):
        values = table[column].to_list()
        if column == "pass@k":
            ks = sorted({k for k in table["k"].to_list() if k is not None})
            label = f"pass@{ks[0]}" if len(ks) == 1 else "pass@k (k per env)"
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(envs))]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=label)
        for bar, value in zip(bars, values):
            ax.annotate("-" if value is None else f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", fontsize=6, rotation=90)
    _env_axis(ax, envs, [f"{env}\nk={'-' if k is None else k}" for env, k in table.select("env", "k").iter_rows()])
    ax.set_ylim(0, 1.5)  # room above the bars for the legend
    ax.set_yticks([0, 0.25, 0.5, 0.75, 1.0])
    ax.set_ylabel("share")
    ax.set_title("rates (reward ones over scored rows)", fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center")


def _plot_components(ax, envs: list[str], components: pl.DataFrame) -> None:
    color = {name: f"C{j % 10}" for j, name in enumerate(sorted(set(components["component"])))}  # same in every env
    for i, env in enumerate(envs):
        part = components.filter(pl.col("env") == env)
        width = 0.8 / max(len(part), 1)
        if part.is_empty():
            ax.annotate("none stored", (i, 0), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
        for j, (name, mean) in enumerate(part.select("component", "mean").iter_rows()):
            x, height = i - 0.4 + width * (j + 0.5), _drawable([mean])[0]
            ax.bar(x, height if np.isfinite(height) else 0.0, width, color=color[name])
            label = f"{plain(name)} {mean:.2f}" if abs(height) < 1e6 else f"{plain(name)} {mean:.3g}"
            top = max(height, 0.0) if np.isfinite(height) else 0.0
            ax.annotate(label, (x, top), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6, rotation=90)
    _env_axis(ax, envs)
    _pad(ax, [0.0, *components["mean"].to_list()], 0.35)
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_ylabel("mean over scored rows")
    ax.set_title("reward components", fontsize=9)
