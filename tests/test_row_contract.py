"""The row contract (hubgym.schemas.row_contract): each rule's message pinned whole on a row that breaks it alone;
the Arrow check and the row-dict check give the same verdict on any row; every reader of stored rows (report,
score, replay, push-rollouts, stats, view, the trainer's sources, iter_rollouts, open_rollouts) refuses a shard
that breaks any rule with one error naming shard, column, row and rule, or with --skip-bad reads the rest and
says how many rows it left out; the writer never stores such a row; run manifests and index.json hold fields of
their types that agree with the shards; stored text reaches the terminal escaped."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from hubgym.cli import app
from hubgym.errors import ManifestError, RowContractError, ShardError, SkippedShardsWarning
from hubgym.hub import LocalHub
from hubgym.hub.rollouts import iter_rollouts, open_rollouts, push_rollouts
from hubgym.rollout.writer import ShardWriter
from hubgym.schemas.row_contract import (
    GROUP_RULES, MAX_ABS_REWARD, ROW_RULES, first_breach, group_breach, row_breach, rules,
)
from hubgym.schemas.tables import rollouts_to_table
from hubgym.stats.table import TaskStats
from hubgym.train.local_shards import LocalShards
from hubgym.viewer import RunStore

from helpers.scored_runs import write_run

runner = CliRunner()
CELL = {"role": "assistant", "content": "x", "tool_calls": None, "tool_call_id": None, "name": None,
        "reasoning": None}


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("contract") / "good")


@pytest.fixture(scope="module")
def rows(good) -> list[dict[str, Any]]:
    return list(iter_rollouts(good))


# -- one breaking change per rule: (rule, column, change to row 1 of a shard, what the message shows) -------------

def _set(column: str, value: Any) -> Callable[[dict], None]:
    return lambda row: row.update({column: value})


def _in(column: str, name: str, value: Any) -> Callable[[dict], None]:
    return lambda row: row.update({column: {**row[column], name: value}})


BREAKS: dict[str, tuple[str, str, Callable[[dict], None], str]] = {
    "empty rollout id": ("name-set", "rollout_id", _set("rollout_id", ""), "''"),
    "empty run id": ("name-set", "run_id", _set("run_id", ""), "''"),
    "empty task id": ("name-set", "task_id", _set("task_id", ""), "''"),
    "empty group": ("name-set", "group", _set("group", ""), "''"),
    "env with an escape": ("env-name", "env", _set("env", "\x1b[31marith"), "'\\x1b[31marith'"),
    "env a path": ("env-name", "env", _set("env", "../../evil"), "'../../evil'"),
    "negative sample": ("sample-index", "sample", _set("sample", -1), "-1"),
    "negative prompt id": ("token-ids-in-range", "prompt_ids", _set("prompt_ids", [1, -5, 3]), "-5"),
    "negative completion id": ("token-ids-in-range", "completion_ids", _set("completion_ids", [-5, 5]), "-5"),
    "ids without a prompt": ("prompt-for-tokens", "prompt_ids", _set("prompt_ids", []),
                             "no prompt ids for 2 completion token(s)"),
    "ids without a completion": ("completion-for-tokens", "completion", _set("completion", []),
                                 "no message for 2 completion token(s)"),
    "mask one short": ("one-mask-per-token", "completion_mask", _set("completion_mask", [1]),
                       "1 value(s) for 2 token(s)"),
    "mask value 2": ("mask-values", "completion_mask", _set("completion_mask", [1, 2]), "2"),
    "logprobs one short": ("one-logprob-per-token", "completion_logprobs", _set("completion_logprobs", [-0.5]),
                           "1 value(s) for 2 token(s)"),
    "a NaN logprob": ("logprobs-finite", "completion_logprobs", _set("completion_logprobs", [math.nan, -0.5]),
                      "nan"),
    "a positive logprob": ("logprobs-finite", "completion_logprobs", _set("completion_logprobs", [-0.5, 0.25]),
                           "0.25"),
    "negative turns": ("count-nonnegative", "num_turns", _set("num_turns", -5), "-5"),
    "a kind that is a path": ("interaction-kind", "interaction", _in("interaction", "kind", "../../evil"),
                              "'../../evil'"),
    "zero max turns": ("interaction-turns", "interaction", _in("interaction", "max_turns", 0), "0"),
    "a reward on a failed row": ("reward-or-error", "reward",
                                 _set("error", {"boundary": "engine", "type": "X", "message": "m"}),
                                 "{'reward': 0.0, 'error': {'boundary': 'engine', 'type': 'X', 'message': 'm'}}"),
    "no reward and no error": ("reward-or-error", "reward", _set("reward", None),
                               "{'reward': None, 'error': None}"),
    "an unknown boundary": ("error-boundary", "error", lambda row: row.update(
        reward=None, error={"boundary": "rollout", "type": "X", "message": "m"}), "'rollout'"),
    "an infinite metric": ("metrics-finite", "metrics", lambda row: row["metrics"][0].update(value=math.inf),
                           "{'name': 'answer_found', 'value': inf}"),
    "a negative timing": ("timings-nonnegative", "timings", _in("timings", "tools_s", -1.0),
                          "{'generate_s': 0.0, 'tools_s': -1.0, 'score_s': 0.0, 'total_s': 0.0}"),
    "a negative policy version": ("policy-version", "provenance", _in("provenance", "policy_version", -3), "-3"),
    "two envs in a group": ("group-one-task", "env", _set("env", "wordle"),
                            "'wordle' in group 'r1-0', whose first row holds 'arithmetic'"),
    "two tasks in a group": ("group-one-task", "task_id", _set("task_id", "other"), None),
    "two runs in a group": ("group-one-task", "run_id", _set("run_id", "r2"), None),
    "a sample twice": ("group-distinct-samples", "sample", _set("sample", 0), "sample 0 twice in group 'r1-0'"),
}


def test_every_rule_has_a_breaking_case():
    """A rule added to the contract needs a case here (and so in every reader's test below)."""
    assert {rule.name for rule in (*ROW_RULES, *GROUP_RULES)} == {rule for rule, *_ in BREAKS.values()}
    cases = {(rule, column) for rule, column, *_ in BREAKS.values()}
    assert {(r.name, r.column) for r in (*ROW_RULES, *GROUP_RULES)} <= cases


def broken(rows: list[dict], name: str) -> list[dict]:
    """The first shard's rows (one group of two) with row 1 changed as BREAKS[name] says."""
    shard = copy.deepcopy(rows[:4])
    BREAKS[name][2](shard[1])
    return shard


@pytest.mark.parametrize("name", list(BREAKS))
def test_each_rule_names_its_column_and_row_and_says_what_it_holds(rows, name):
    rule, column, _, holds = BREAKS[name]
    shard = broken(rows, name)
    table = rollouts_to_table(shard)
    breach = first_breach(table.to_batches()[0]) or group_breach(table)
    assert (breach.rule.name, breach.column, breach.row) == (rule, column, 1)
    if holds is not None:
        says = next(r.says for r in (*ROW_RULES, *GROUP_RULES) if r.name == rule and r.column == column)
        assert breach.message() == f"breaks rule {rule}: {says} (it holds {holds})"
    if rule.startswith("group"):
        return
    assert row_breach(shard[1]).rule.name == rule  # the row-dict check agrees
    assert row_breach(shard[0]) is None and first_breach(rollouts_to_table(shard[:1]).to_batches()[0]) is None


def test_ids_past_the_vocabulary_break_only_where_a_vocabulary_is_given(rows):
    batch = rollouts_to_table(rows[:4]).to_batches()[0]  # prompt ids 1, 2, 3; completion ids 4, 5
    assert first_breach(batch) is None and first_breach(batch, vocab_size=6) is None
    breach = first_breach(batch, vocab_size=5)
    assert (breach.rule.name, breach.column, breach.value) == ("token-ids-in-vocabulary", "completion_ids", 5)
    assert row_breach(rows[0], vocab_size=5).rule.name == "token-ids-in-vocabulary"


def test_readers_given_a_vocabulary_hold_every_shard_to_it(good):
    said = r"column 'completion_ids', row 0 \(rollout 'r1-0-0'\) breaks rule token-ids-in-vocabulary: .* \(it holds 5\)"
    for read in (lambda: list(LocalShards(good, vocab_size=5)), lambda: list(iter_rollouts(good, vocab_size=5)),
                 lambda: RunStore.open([str(good)], vocab_size=5)):
        with pytest.raises(ShardError, match=said):
            read()
    assert len(list(LocalShards(good, vocab_size=6))) == 8


def test_the_documented_contract_lists_every_rule():
    listed = {(name, column) for name, column, _ in rules()}
    assert {(r.name, r.column) for r in (*ROW_RULES, *GROUP_RULES)} <= listed
    assert {"valid-arrow", "not-null", "info-json", "rollout-id-unique", "run-id-recorded"} <= {n for n, *_ in rules()}


# -- the two implementations agree on any row ----------------------------------------------------------------------

HOSTILE = st.sampled_from([-(2**31), -1, 0, 1, 2**31 - 1])
FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, 3e38, -3e38, -0.5, 0.0, -0.0, 0.5, None])
CHANGES = {
    "prompt_ids": st.lists(HOSTILE, max_size=4), "completion_ids": st.lists(HOSTILE, max_size=4),
    "completion_mask": st.lists(st.sampled_from([-1, 0, 1, 2]), max_size=4),
    "completion_logprobs": st.lists(FLOATS.filter(lambda x: x is not None), max_size=4),
    "sample": HOSTILE, "num_turns": HOSTILE, "reward": FLOATS,
    "env": st.sampled_from(["arithmetic", "", "a b", "\x1b[31m", "x" * 65, "_x", "x9_"]),
    "completion": st.sampled_from([[], [CELL]]),
    "error": st.sampled_from([None, {"boundary": "engine", "type": "X", "message": "m"},
                              {"boundary": "rollout", "type": "X", "message": "m"}]),
}


@pytest.mark.slow
@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_arrow_check_and_the_row_check_give_the_same_verdict(rows, data):
    row = copy.deepcopy(rows[0])
    for column in data.draw(st.lists(st.sampled_from(sorted(CHANGES)), max_size=4, unique=True)):
        row[column] = data.draw(CHANGES[column])
    vocab = data.draw(st.sampled_from([None, 3, 10, 2**31 - 1]))
    from_arrow = first_breach(rollouts_to_table([row]).to_batches()[0], vocab_size=vocab)
    from_dict = row_breach(row, vocab_size=vocab)
    assert (from_arrow and (from_arrow.rule.name, from_arrow.column)) == \
        (from_dict and (from_dict.rule.name, from_dict.column)), row


# -- every reader ----------------------------------------------------------------------------------------------------

def forge(good: Path, folder: Path, shard_rows: list[dict]) -> Path:
    """`good` with its first shard replaced by `shard_rows`, written by pyarrow (not hubgym's writer) with its
    sha256 and rows recorded in the manifest, as a forger who controls the run folder would."""
    run = Path(shutil.copytree(good, folder))
    shard = sorted((run / "shards").glob("*.arrow"))[0]
    table = rollouts_to_table(shard_rows)
    with pa.ipc.new_file(str(shard), table.schema) as writer:
        writer.write_table(table)
    manifest = run / "manifest-w000of001.json"
    record = json.loads(manifest.read_text())
    record["shard_files"][shard.name] = {"sha256": hashlib.sha256(shard.read_bytes()).hexdigest(),
                                         "rows": len(shard_rows)}
    manifest.write_text(json.dumps(record))
    return run


def cli_line(args: list[str]) -> str:
    result = runner.invoke(app, args, env={"COLUMNS": "500"})
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 1 and len(errors) == 1 and "Traceback" not in result.output, result.output[-2000:]
    return errors[0]


READERS: dict[str, Callable[[Path, Path], Any]] = {
    "report": lambda run, tmp: cli_line(["report", str(run), "--plot", str(tmp / "r.png")]),
    "score": lambda run, tmp: cli_line(["score", str(run), "--workers", "1", "--out", str(tmp / "scored")]),
    "replay": lambda run, tmp: cli_line(["replay", str(run)]),
    "stats": lambda run, tmp: cli_line(["stats", str(run)]),
    "push-rollouts": lambda run, tmp: cli_line(["push-rollouts", str(run), "org/x", "--hub", str(tmp / "hub")]),
    "view": lambda run, tmp: RunStore.open([str(run)]),
    "train's local shards": lambda run, tmp: list(LocalShards(run)),
    "iter_rollouts": lambda run, tmp: list(iter_rollouts(run)),
    "open_rollouts": lambda run, tmp: list(open_rollouts(run)),
    "task stats": lambda run, tmp: TaskStats.from_rollouts([str(run)]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BREAKS))
def test_every_reader_refuses_a_shard_that_breaks_a_rule_naming_shard_column_row_and_rule(good, rows, tmp_path,
                                                                                           name):
    rule, column, *_ = BREAKS[name]
    run = forge(good, tmp_path / "run", broken(rows, name))
    # a row of another run in a group is also one its manifest does not record: that rule is checked first
    rules = rf"(?:{rule}|run-id-recorded)" if column == "run_id" else rule
    said = re.compile(rf"shard \S*w000of001-00000\.arrow: column '{column}', row 1(?: \(rollout '[^']*'\))? breaks "
                      rf"rule {rules}: ")
    for reader, read in READERS.items():
        try:
            line = read(run, tmp_path / reader.replace(" ", "_").replace("'", ""))
        except ShardError as exc:
            line = str(exc)
            assert (exc.column, exc.row) == (column, 1) and re.fullmatch(rules, exc.rule), reader
        assert isinstance(line, str) and said.search(line), f"{reader}: {line}"
    assert not (tmp_path / "score" / "scored" / "manifest-w000of001.json").exists()  # a refused re-score: nothing


@pytest.mark.slow
def test_skip_bad_reads_the_rest_and_says_how_many_rows_it_left_out(good, rows, tmp_path):
    run = forge(good, tmp_path / "run", broken(rows, "negative completion id"))
    for command, extra in (("report", ["--plot", str(tmp_path / "r.png")]), ("score", ["--workers", "1"]),
                           ("stats", []), ("replay", [])):
        done = runner.invoke(app, [command, str(run), "--skip-bad", *extra], env={"COLUMNS": "500"})
        assert done.exit_code == 0, done.output
        assert ("note: skipped 1 bad shard(s) (of 2 in this read), holding 4 row(s): " in done.output
                and "w000of001-00000.arrow (column 'completion_ids', row 1: rule token-ids-in-range)" in done.output), \
            done.output
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counts: dict = {}
        assert len(list(iter_rollouts(run, skip_bad=True, counts=counts))) == 4
    assert counts["bad_rows"] == 4 and counts["bad_shards"] == 1
    assert any(issubclass(w.category, SkippedShardsWarning) and "holding 4 row(s)" in str(w.message) for w in caught)


def test_a_row_of_another_run_than_its_manifest_records_is_refused(good, rows, tmp_path):
    shard = copy.deepcopy(rows[:4])
    for row in shard[:2]:  # a whole group of another run: the group rules hold, the manifest's run id does not
        row["run_id"] = "elsewhere"
    run = forge(good, tmp_path / "run", shard)
    with pytest.raises(ShardError, match=r"column 'run_id', row 0 \(rollout 'r1-0-0'\) breaks rule run-id-recorded: "
                                         r"is the run id its run manifest records \('r1'\) \(it holds 'elsewhere'\)"):
        list(iter_rollouts(run))
    (run / "manifest-w000of001.json").unlink()  # nothing records a run id (nor a sha256): nothing to compare
    assert len(list(iter_rollouts(run))) == 8


def test_the_writer_never_stores_a_row_readers_would_refuse(rows, tmp_path):
    for name in ("negative completion id", "a NaN logprob", "two tasks in a group", "env a path"):
        writer = ShardWriter(tmp_path / name.replace(" ", "_"), "w000of001")
        writer.add_group(broken(rows, name)[:2], flush=False)
        with pytest.raises(RowContractError, match=rf"breaks rule {BREAKS[name][0]}: .*fix the code that made it"):
            writer.flush()
        assert not list(writer.shard_dir.glob("*.arrow")) and not list(writer.shard_dir.glob(".*"))
        writer.close()


def test_a_reward_too_large_to_sum_is_read_as_no_reward(good, rows, tmp_path):
    shard = copy.deepcopy(rows[:4])
    shard[0]["reward"], shard[1]["reward"] = 1.7e308, -(2.0**53) * 4
    shard[2]["reward"] = MAX_ABS_REWARD  # at the bound: a reward
    run = forge(good, tmp_path / "run", shard)
    read = {r["rollout_id"]: r for r in iter_rollouts(run)}
    for row in shard[:2]:
        got = read[row["rollout_id"]]
        assert got["reward"] is None and got["error"]["type"] == "NonFiniteReward"
        assert "is past +-2^53" in got["error"]["message"]
    assert read[shard[2]["rollout_id"]]["reward"] == MAX_ABS_REWARD
    done = runner.invoke(app, ["score", str(run), "--workers", "1", "--out", str(tmp_path / "out")])
    assert done.exit_code == 0 and (tmp_path / "out" / "manifest-w000of001.json").exists(), done.output


# -- manifests -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, says", [
    ("rows", "12", "has rows as a string, expected integer"),
    ("rows", 7, "has rows 7, but the rows of its shard_files add up to 8"),
    ("rows", -1, "has rows -1, expected a count >= 0"),
    ("n", 2.5, "has n as a number, expected integer"),
    ("policy_version", True, "has policy_version as a boolean, expected integer"),
    ("run_id", 5, "has run_id as an integer, expected string or null"),
    ("shards", ["a", 5], "has shards[1] as an integer, expected string"),
    ("worker", None, "has worker as null, expected string"),
])
def test_a_run_manifest_holds_fields_of_their_types_that_agree_with_its_shards(good, tmp_path, field, value, says):
    run = Path(shutil.copytree(good, tmp_path / "run"))
    manifest = run / "manifest-w000of001.json"
    record = json.loads(manifest.read_text())
    record[field] = value
    manifest.write_text(json.dumps(record))
    for read in (lambda: list(iter_rollouts(run)), lambda: RunStore.open([str(run)])):
        with pytest.raises(ManifestError, match=re.escape(says)):
            read()
    assert says in cli_line(["report", str(run)])


def test_index_json_rows_must_add_up(good, tmp_path):
    hub = LocalHub(tmp_path / "hub")
    pushed = push_rollouts(good, "org/r", hub=hub)
    snapshot = next((tmp_path / "hub").rglob("index.json"))
    index = json.loads(snapshot.read_text())
    hub.commit("org/r", {"r1/index.json": json.dumps({**index, "rows": index["rows"] + 1}).encode()}, "edit")
    with pytest.raises(ManifestError, match="has rows 9, but the rows of its shards add up to 8"):
        list(iter_rollouts("org/r:r1", hub=hub))
    assert pushed.rows == 8


# -- what reaches the terminal -----------------------------------------------------------------------------------

def test_stored_text_reaches_the_terminal_with_control_characters_escaped(good, rows, tmp_path):
    shard = copy.deepcopy(rows[:4])
    for row in shard:
        row["metrics"] = [{"name": "reward/\x1b[31mred\x1b[0m\u202e", "value": 1.0}, *row["metrics"]]
    run = forge(good, tmp_path / "run", shard)
    for command, extra in (("report", ["--plot", str(tmp_path / "r.png")]), ("score", ["--workers", "1"])):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a plot's label holding the escape would warn, printing it raw
            done = runner.invoke(app, [command, str(run), *extra], env={"COLUMNS": "500"})
        assert done.exit_code == 0, done.output
        assert "\x1b" not in done.output and "\u202e" not in done.output
    assert "\\x1b[31mred\\x1b[0m\\u202e" in done.output  # score's table of what changed names the metric
    from hubgym.schemas.text import plain

    assert plain("a\x07b\nc\td\x9be") == "a\\x07b\\nc\\td\\x9be" and plain("plain text, é ü 中") == "plain text, é ü 中"


def test_a_plot_that_cannot_be_drawn_does_not_fail_a_finished_re_score(good, tmp_path, monkeypatch):
    import importlib

    rescore = importlib.import_module("hubgym.score.rescore")  # the module (hubgym.score.rescore is the function)

    def broken_plot(*args, **kwargs):
        raise ValueError("arange: cannot compute length")

    monkeypatch.setattr(rescore, "plot_diff", broken_plot)
    done = runner.invoke(app, ["score", str(good), "--workers", "1", "--out", str(tmp_path / "out")])
    assert done.exit_code == 0 and "note: no plot drawn (ValueError: arange: cannot compute length)" in done.output
    assert (tmp_path / "out" / "manifest-w000of001.json").exists()


# -- where a tokenizer or model is known, ids are held below its vocabulary ------------------------------------------

def past_the_vocabulary(good: Path, rows: list[dict], folder: Path, vocab: int) -> Path:
    shard = copy.deepcopy(rows[:4])
    shard[1]["completion_ids"] = [4, vocab]  # one past the last id the model has
    return forge(good, folder, shard)


@pytest.mark.slow
def test_replay_with_a_model_refuses_ids_its_tokenizer_lacks(good, rows, tiny_model, tmp_path):
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tiny_model)))
    run = past_the_vocabulary(good, rows, tmp_path / "run", vocab)
    line = cli_line(["replay", str(run), "--model", str(tiny_model)])
    assert f"column 'completion_ids' breaks rule token-ids-in-vocabulary: holds token ids below the vocabulary size " \
           f"of the tokenizer in use ({vocab}) (it holds {vocab})" in line, line
    assert runner.invoke(app, ["replay", str(run)]).exit_code == 0  # no tokenizer named: ids below 2^31 are read


@pytest.mark.slow
def test_offline_training_refuses_ids_past_the_models_vocabulary_before_any_step(good, rows, tiny_model, tmp_path):
    """Once an IndexError inside the output layer: now the reader's one error, naming shard, column, row and rule."""
    import io

    from rich.console import Console

    from hubgym.train.config import TINY_CONFIG, load_config
    from hubgym.train.trainer import Trainer

    run = past_the_vocabulary(good, rows, tmp_path / "run", 749)  # the tiny model's vocabulary
    sets = [f"model={tiny_model}", f"output_dir={tmp_path / 'out'}", f"offline.sources=[{run}]", "offline.steps=1",
            "eval.limit=0", "batch.groups_per_step=1", "grpo.n=2", "log.every=1000"]
    trainer = Trainer(load_config(TINY_CONFIG, sets), console=Console(file=io.StringIO()))
    try:
        said = r"column 'completion_ids', row 1 \(rollout 'r1-0-1'\) breaks rule token-ids-in-vocabulary: "
        with pytest.raises(ShardError, match=said + r".*\(749\) \(it holds 749\)"):
            trainer.run()
    finally:
        trainer.close()
    assert not (tmp_path / "out" / "model").exists()


def test_the_trainers_row_admission_holds_rows_from_any_source_to_the_same_rules(rows):
    """A source of row dicts (not shards: nothing checked them where they were read) gets the same rules, row by
    row: a row that breaks one is skipped and counted under its column (strict mode: refused)."""
    from hubgym.errors import BadRowError
    from hubgym.train.groups import GroupSettings
    from hubgym.train.stream import GroupStream

    source = copy.deepcopy(rows)  # 4 groups of 2
    source[1]["completion_ids"] = [-5, 5]                       # group r1-0: a row past the token range
    source[3]["task_id"] = "another task"                       # group r1-1: its second row of another task
    stream = GroupStream([source], GroupSettings(n=2, short_groups="drop"))
    assert sorted(g.key for g in stream) == ["r1-2", "r1-3"]
    assert stream.counts["skipped_rows/completion_ids"] == 1 and stream.counts["skipped_rows/task_id"] == 1
    with pytest.raises(BadRowError, match="field 'completion_ids': breaks rule token-ids-in-range"):
        list(GroupStream([source], GroupSettings(n=2, strict=True)))


@pytest.mark.parametrize("where", ["schema", "column"])
def test_schema_metadata_that_is_not_utf8_is_refused_by_every_reader_alike(good, rows, tmp_path, where):
    """Once refused by push-rollouts alone (it publishes the features), read by the others."""
    run = forge(good, tmp_path / "run", copy.deepcopy(rows[:4]))
    shard = sorted((run / "shards").glob("*.arrow"))[0]
    table = pa.ipc.open_file(str(shard)).read_all()
    if where == "schema":
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"huggingface": b'{"x": "\xff"}'})
    else:
        at = table.schema.get_field_index("env")
        table = table.set_column(at, table.schema.field(at).with_metadata({b"note": b"\xc3\x28"}), table.column(at))
    run = forge(good, tmp_path / "forged", table.to_pylist())
    shard = sorted((run / "shards").glob("*.arrow"))[0]
    with pa.ipc.new_file(str(shard), table.schema) as writer:  # the forged metadata kept this time
        writer.write_table(table)
    manifest = run / "manifest-w000of001.json"
    record = json.loads(manifest.read_text())
    record["shard_files"][shard.name]["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    manifest.write_text(json.dumps(record))
    for reader in ("report", "score", "push-rollouts", "stats", "iter_rollouts", "view"):
        try:
            line = READERS[reader](run, tmp_path / reader)
        except ShardError as exc:
            line = str(exc)
        assert "breaks rule schema-metadata: it is UTF-8 text" in line, (reader, line)


def test_a_fifo_or_a_device_where_a_manifest_should_be_is_refused_never_waited_on(good, tmp_path):
    import os

    run = Path(shutil.copytree(good, tmp_path / "run"))
    manifest = run / "manifest-w000of001.json"
    manifest.unlink()
    os.mkfifo(manifest)  # reading it would wait for a writer forever
    line = cli_line(["report", str(run)])
    assert "manifest-w000of001.json cannot be read (not a regular file" in line
    manifest.unlink()
    manifest.symlink_to("/dev/zero")  # read whole, it would never end
    assert "cannot be read (not a regular file" in cli_line(["score", str(run), "--workers", "1"])
