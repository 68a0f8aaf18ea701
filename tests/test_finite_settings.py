"""Numbers are finite where they must be, and no input hangs or ends in a traceback: NaN and infinity refused by
name in every numeric setting (the training config, rollout options, mixture weights); mixture specs that are
binary, a FIFO or nested 100,000 deep; a mixture size past an env's task space; a mixture run of 10^12 tasks; a
regex that backtracks forever and a file that is not UTF-8 given to `wrap`; `--engine openai --model tiny`
without the network; a path longer than the filesystem allows; offline data with nothing to train on; and a
training run whose loss or weights stop being finite, which stops with one line and exports nothing."""

from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.errors import EnvContractError, SettingError
from hubgym.mixture import Mixture, load_mix_spec, parse_spec
from hubgym.engines import SamplingArgs
from hubgym.train.config import TINY_CONFIG, ConfigError, load_config

runner = CliRunner()


def one_error_line(args: list[str]) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (result.exception, result.output)
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


@pytest.mark.parametrize("override, named", [
    ("optim.lr=inf", "optim.lr='inf' must be a finite number"), ("optim.lr=nan", "optim.lr='nan'"),
    ("loss.beta=-inf", "loss.beta='-inf'"), ("optim.lr=1e39", "optim.lr='1e39' must be <= 1"),
    ("sampling.temperature=.nan", "sampling.temperature=nan must be"),
    ("online.pass_band=[0.1,.inf]", "online.pass_band.1=inf must be"),
    ("envs=[{name: 'arithmetic:tiny', weight: .inf}]", "envs.0.weight=inf must be")])
def test_the_training_config_refuses_nan_and_infinity_by_name(override, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(TINY_CONFIG, [override])


@pytest.mark.parametrize("field, value", [("temperature", float("inf")), ("temperature", float("nan")),
                                          ("top_p", float("nan")), ("temperature", -1.0)])
def test_sampling_options_refuse_nan_and_infinity_by_name(field, value):
    with pytest.raises(SettingError, match=f"sampling {field}={value!r} must be a finite number") as refused:
        SamplingArgs(**{field: value})
    assert refused.value.setting == field
    assert "sampling temperature=inf must be a finite number >= 0" in one_error_line(
        ["rollout", "arithmetic", "--temperature", "inf"])


@pytest.mark.parametrize("spec, named", [
    ("envs:\n  - {name: arithmetic:easy, weight: .inf}\n", "envs.0.weight: Input should be a finite number"),
    ("envs:\n  - {name: arithmetic:easy, weight: .nan}\n", "envs.0.weight: Input should be a finite number"),
    ("envs: [arithmetic:easy]\ntag_weights: {math: .inf}\n", "tag_weights.math: Input should be a finite number")])
def test_a_mixture_refuses_nan_and_infinite_weights_by_name(tmp_path, spec, named):
    path = tmp_path / "mix.yaml"
    path.write_text(spec)
    with pytest.raises(EnvContractError, match=re.escape(named)):
        load_mix_spec(path)


@pytest.mark.slow
def test_a_mixture_spec_that_is_binary_a_fifo_or_deep_is_one_line(tmp_path):
    binary, fifo, deep = tmp_path / "binary.yaml", tmp_path / "fifo.yaml", tmp_path / "deep.yaml"
    binary.write_bytes(bytes(range(128, 256)) * 4)
    os.mkfifo(fifo)  # reading it would block until someone writes
    deep.write_text("envs: " + "[" * 100_000 + "]" * 100_000)
    cases = ((binary, "not UTF-8 text (byte 0x80 at 0)"), (fifo, "not a regular file"), (deep, "nested too deep"))
    for path, said in cases:
        line = one_error_line(["rollout", "--mix", str(path), "--tasks", "3"])
        assert f"cannot read mixture spec {path}: {said}" in line, line


def test_a_mixture_size_past_the_task_space_ends_the_epoch_instead_of_drawing_forever():
    mixture = Mixture.from_spec(parse_spec({"envs": [{"name": "arithmetic:easy", "size": 10**12}]}), split="test")
    drawn = mixture.take(1000)  # arithmetic:easy holds fewer distinct tasks: what it has, then the draws stop
    assert 0 < len(drawn) < 1000 and len({d.task["id"] for d in drawn}) == len(drawn)


def test_a_mixture_run_of_a_trillion_tasks_is_refused_up_front(tmp_path):
    spec = tmp_path / "mix.yaml"
    spec.write_text("envs: [arithmetic:easy]\n")
    line = one_error_line(["rollout", "--mix", str(spec), "--tasks", "1000000000000"])
    assert "--tasks 1,000,000,000,000: a mixture run draws its tasks before it samples, at most 1,000,000" in line


def test_wrap_bounds_a_regex_that_backtracks_and_names_a_file_that_is_not_utf8(tmp_path, monkeypatch):
    from hubgym.authoring import source_checks as wrap_checks

    monkeypatch.setattr(wrap_checks, "REGEX_LIMIT_S", 0.5)
    data = tmp_path / "slow.jsonl"
    data.write_text('{"q": "a question", "a": "' + "a" * 40 + 'b"}\n{"q": "another", "a": "aab"}\n')
    line = one_error_line(["wrap", str(data), "--prompt", "q", "--answer", "a", "--reward", "exact",
                           "--answer-regex", "(a+)+$", "--out", str(tmp_path / "out")])
    assert "--answer-regex '(a+)+$' ran for more than 0.5 s on the answer" in line and "row='row 0'" in line
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"q": "caf\u00e9?", "a": "x"}\n{"q": "b", "a": "y"}\n'.encode("latin-1"))
    line = one_error_line(["wrap", str(latin), "--prompt", "q", "--answer", "a", "--reward", "exact", "--out",
                           str(tmp_path / "out2")])
    assert "the column holds text that is not UTF-8" in line and "field='q'" in line and "iconv" in line
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


@pytest.mark.slow
def test_the_openai_engine_with_model_tiny_uses_the_tiny_tokenizer_here(tmp_path):
    """No Hub lookup of a model called `tiny`: the run gets as far as the server (none listens on port 9)."""
    from hubgym.models.tiny import default_tiny_model

    line = one_error_line(["rollout", "arithmetic", "--engine", "openai", "--base-url", "http://127.0.0.1:9/v1",
                           "--model", "tiny", "--limit", "1", "--n", "1", "--out", str(tmp_path / "run")])
    assert "OpenAI-compatible server at http://127.0.0.1:9/v1" in line and str(default_tiny_model()) in line


def test_a_path_longer_than_the_filesystem_allows_is_one_line(tmp_path):
    long = str(tmp_path / ("a" * 300))
    for command in (["report", long], ["score", long], ["replay", long], ["stats", long]):
        line = one_error_line(command)  # where the path is looked at with os.path, it just does not exist
        assert "the name is too long for this system" in line or f"{long[:40]}" in line, line


def poisoned(monkeypatch, when: str):
    """Fault injection: one weight set to NaN before the first step's forward (its loss is then NaN, and DeepSpeed
    skips the update) or to inf after its update (a finite step that left a weight that is not)."""
    import torch

    from hubgym.train.engine import Policy

    real = Policy.train_step

    def train_step(self, micro_batches, loss_fn):
        weight = next(self.module.parameters())
        if when == "before":
            with torch.no_grad():
                weight.view(-1)[0] = float("nan")
        stats = real(self, micro_batches, loss_fn)
        if when == "after":
            with torch.no_grad():
                weight.view(-1)[0] = float("inf")
        return stats
    monkeypatch.setattr(Policy, "train_step", train_step)


@pytest.mark.slow
@pytest.mark.parametrize("when, what", [("before", "the loss"), ("after", "a weight")])
def test_a_loss_or_weight_that_is_not_finite_stops_training_and_nothing_is_exported(tiny_model, tmp_path,
                                                                                     monkeypatch, when, what):
    """The run stops at that step, saves nothing of it and exports no model; the CLI says so in one line."""
    from helpers.scored_runs import make_run

    poisoned(monkeypatch, when)
    rollouts = make_run(tmp_path / "rollouts", "r", groups=4, right=lambda g, s: s == 0)
    line = one_error_line(["train", str(TINY_CONFIG), "--set", f"model={tiny_model}", "--set",
                           f"output_dir={tmp_path / 'out'}", "--set", f"offline.sources=[{rollouts}]", "--set",
                           "offline.steps=2", "--set", "eval.limit=0", "--set", "batch.groups_per_step=2", "--set",
                           "grpo.n=2", "--set", "loss.max_staleness=0", "--set", "checkpoint_every=1"])
    assert f"step 0: {what} is not finite, so the run stopped" in line, line
    assert not (tmp_path / "out" / "model").exists() and not list((tmp_path / "out" / "checkpoints").glob("step-*"))


@pytest.mark.slow
def test_offline_data_with_nothing_to_train_on_is_one_line(tiny_model, tmp_path):
    from helpers.scored_runs import make_run

    rows = make_run(tmp_path / "rollouts", "r", groups=2, right=lambda g, s: s == 0)  # arithmetic rows only
    line = one_error_line(["train", str(TINY_CONFIG), "--set", f"model={tiny_model}", "--set",
                           f"output_dir={tmp_path / 'out'}", "--set", f"offline.sources=[{rows}]", "--set",
                           "offline.steps=1", "--set", "eval.limit=0", "--set", "grpo.n=2", "--set",
                           "envs=[{name: 'reverse_text'}]"])
    assert "hold no trainable group" in line and "reverse_text" in line, line


@pytest.mark.parametrize("make, said", [
    (lambda path: os.mkfifo(path), "not a regular file (a FIFO would block and a device never end)"),
    (lambda path: path.write_bytes(b"model: tiny\nseed: \xff\n"), "not UTF-8 text (byte 0xff at 18)"),
    (lambda path: path.write_bytes(b"x" * (16 << 20) + b"x"), "16,777,217 bytes, past the 16,777,216"),
    (lambda path: path.mkdir(), "not a regular file"),
    (lambda path: path.write_text("a: " + "[" * 100_000 + "]" * 100_000), "nested too deep"),
])
def test_a_training_config_is_read_only_when_it_is_a_small_regular_text_file(tmp_path, make, said):
    path = tmp_path / "train.yaml"
    make(path)
    line = one_error_line(["train", str(path)])
    assert f"cannot read training config {path}: {said}" in line, line


def test_a_training_config_on_a_device_is_refused_before_it_is_read():
    line = one_error_line(["train", "/dev/zero"])  # read whole, it would grow without end
    assert "cannot read training config /dev/zero: not a regular file" in line


@pytest.mark.parametrize("args, said", [
    (["rollout", "arithmetic", "--n", "1000000000000"], "n=1,000,000,000,000 is past the 65,536 hubgym takes"),
    (["rollout", "arithmetic", "--n", "65537"], "n=65,537 is past the 65,536 hubgym takes"),
    (["train", "--set", "grpo.n=1000000000000"], "grpo.n=1000000000000 must be <= 65536"),
    (["train", "--set", "eval.n=65537"], "eval.n=65537 must be <= 65536"),
    (["eval", "tiny", "arithmetic", "--n", "1000000000000"], "n=1,000,000,000,000 is past the 65,536"),
])
def test_counts_past_their_bound_are_refused_up_front_naming_the_bound(args, said):
    """Before any engine starts: `rollout --n 10^12` once started vLLM and sat silent."""
    assert said in one_error_line(args)


def test_a_rollout_config_refuses_a_count_past_its_bound_however_it_is_made(tmp_path):
    from hubgym.rollout import RolloutConfig

    with pytest.raises(SettingError, match="n=65,537 is past the 65,536 hubgym takes: the n samples of a task") as bad:
        RolloutConfig(envs=["arithmetic"], model="tiny", out=str(tmp_path), n=65_537)
    assert bad.value.setting == "n"
    assert RolloutConfig(envs=["arithmetic"], model="tiny", out=str(tmp_path), n=65_536).n == 65_536
