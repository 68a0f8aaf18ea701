"""`hubgym wrap`: the shipped GSM8K fixture and a multiple-choice fixture become env folders that pass `hubgym check`,
push to a local hub and load back with plain `datasets`; every kind of bad input is one clear error, and nothing is
left half-written."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import hubgym.cli.wrap  # noqa: F401  registers `wrap` (the CLI package imports it once the command is listed)
from hubgym import assistant, build_tasks, make_task, resolve_env, user
from hubgym.cli import app
from hubgym.conformance import check_env
from hubgym.errors import EnvContractError, Where
from hubgym.hub import LocalHub
from hubgym.authoring.wrap import WrapSpec, wrap_dataset

ROOT = Path(__file__).parents[1]
GSM8K = ROOT / "hubgym" / "builders" / "data" / "gsm8k_tiny"  # answers end with "#### <number>"
CAPITALS = ROOT / "tests" / "fixtures" / "wrap" / "capitals"  # question, choices, answer (letter), label (index)
GSM8K_REGEX = r"####\s*(.+)$"
DOC_SECTIONS = ("Task:", "Row schema:", "Reward:", "Arguments:", "Version history:")


def hubgym(*args):
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def compiles_cleanly(folder: Path) -> bool:
    """The generated Python compiles without warnings (an invalid escape in a docstring would warn)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("builder.py", "verifier.py"):
            compile((folder / name).read_text(), name, "exec")
    return True


def failed_checks(folder: Path) -> list[str]:
    return [r.message for r in check_env(str(folder), max_rows=20) if not r.ok]


def reward(folder: Path, task: dict, reply: str) -> float:
    """The reward of one reply; `task` is a built row, or {"info": ...} alone."""
    builder = resolve_env(str(folder))
    task = task if "id" in task else make_task(builder.ENV, [user("(a question)")], task["info"])
    score = builder.verifier().score(task, [assistant(reply)])
    assert score.error is None, score.error
    return score.reward


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["numeric", "math_verify", "exact"])
def test_gsm8k_fixture_wraps_into_an_env_that_passes_check(tmp_path, kind):
    out = tmp_path / f"gsm8k_{kind}"
    made = hubgym("wrap", GSM8K, "--prompt", "question", "--answer", "answer", "--reward", kind,
                  "--answer-regex", GSM8K_REGEX, "--out", out)
    assert made.exit_code == 0, made.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "builder.py", "data", "golden.jsonl", "verifier.py"]
    assert failed_checks(out) == [] and compiles_cleanly(out)
    builder = (out / "builder.py").read_text()
    assert all(section in builder for section in DOC_SECTIONS)
    assert 'ANSWER_PATTERN = re.compile(r"####\\s*(.+)$")' in builder
    assert pq.read_table(out / "data" / "train.parquet").column_names == ["question", "answer"]
    tasks = build_tasks(str(out))
    assert {split: len(rows) for split, rows in tasks.items()} == {"train": 12, "test": 8}
    first = tasks["train"][0]
    assert first["info"] == {"answer": "26"} and "<answer></answer>" in first["prompt"][0]["content"]
    assert reward(out, first, "3 * 12 - 10 = 26. <answer>26</answer>") == 1.0
    assert reward(out, first, "<answer>27</answer>") == 0.0 and reward(out, first, "26") == 0.0  # the tag is the format
    golden = [json.loads(line) for line in (out / "golden.jsonl").read_text().splitlines()]
    assert {case["reward"] for case in golden} == {0.0, 1.0}
    assert (kind in (out / "README.md").read_text()) and f"--reward {kind}" in (out / "README.md").read_text()


def test_numeric_and_math_verify_rewards_compare_numbers_not_text(tmp_path):
    numeric = wrap_dataset(WrapSpec(str(GSM8K), "question", "answer", "numeric", tmp_path / "n",
                                    answer_regex=GSM8K_REGEX, name="gsm_n"))
    math = wrap_dataset(WrapSpec(str(GSM8K), "question", "answer", "math_verify", tmp_path / "m",
                                 answer_regex=GSM8K_REGEX, name="gsm_m"))
    task = {"info": {"answer": "1200"}}
    assert reward(numeric, task, "<answer>$1,200</answer>") == reward(numeric, task, "<answer>1200.0</answer>") == 1.0
    assert reward(numeric, task, "<answer>1200 or 1201</answer>") == 0.0  # hedging earns nothing
    assert reward(math, {"info": {"answer": "0.5"}}, "<answer>\\frac{1}{2}</answer>") == 1.0


@pytest.mark.slow
def test_multiple_choice_fixture_wraps_by_letter_or_by_index(tmp_path):
    for column, name in (("answer", "capitals"), ("label", "capitals_by_index")):
        out = tmp_path / name
        made = hubgym("wrap", CAPITALS, "--prompt", "question", "--choices", "choices", "--answer", column,
                      "--reward", "choice", "--name", name, "--out", out)
        assert made.exit_code == 0, made.output
        assert failed_checks(out) == [] and compiles_cleanly(out)
        first = build_tasks(str(out))["train"][0]
        assert first["info"] == {"answer": "B", "choices": ["Berlin", "Paris", "Madrid", "Rome"]}
        options = "A. Berlin\nB. Paris\nC. Madrid\nD. Rome"
        assert first["prompt"][1]["content"] == f"What is the capital of France?\n\n{options}"
        for reply, earned in (("<answer>B</answer>", 1.0), ("<answer>(b)</answer>", 1.0),
                              ("<answer>paris</answer>", 1.0), ("<answer>B. Paris</answer>", 1.0),
                              ("<answer>A</answer>", 0.0), ("<answer>E</answer>", 0.0), ("B", 0.0)):
            assert reward(out, first, reply) == earned, reply


@pytest.mark.slow
def test_a_wrapped_env_pushes_to_a_local_hub_and_loads_back_with_datasets(tmp_path):
    out = wrap_dataset(WrapSpec(str(CAPITALS), "question", "answer", "choice", tmp_path / "capitals",
                                choices="choices", split_map={"train": "train", "eval": "test"}))
    hub = tmp_path / "hub"
    pushed = hubgym("push", out, "demo/capitals", "--hub", hub)
    assert pushed.exit_code == 0, pushed.output
    snapshot = LocalHub(hub).resolve("demo/capitals")
    loaded = datasets.load_dataset(str(snapshot.path), "default", split="eval")
    assert len(loaded) == 4 and loaded[0]["env"] == "capitals"
    assert loaded[0]["info"]["answer"] == "A" and loaded[0]["info"]["choices"][0] == "Lima"
    assert loaded["id"] == build_tasks(str(out))["eval"]["id"]
    assert (snapshot.path / "verifier.py").read_bytes() == (out / "verifier.py").read_bytes()


@pytest.mark.slow
def test_split_map_limit_system_and_repeated_rows(tmp_path):
    source = tmp_path / "quiz"
    source.mkdir()
    rows = [{"q": "Capital of Italy?", "a": "Rome"}] * 2 + [{"q": f"Say {w}", "a": w} for w in ("yes", "no", "maybe")]
    (source / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = wrap_dataset(WrapSpec(str(source), "q", "a", "exact", tmp_path / "quiz_env", split_map={"test": "validation"},
                                limit=4, system="You are a quiz master."))
    assert failed_checks(out) == []
    test = build_tasks(str(out))["test"]
    assert len(test) == 3  # the first 4 rows, one of them a repeat
    assert test[0]["prompt"][0]["content"] == "You are a quiz master. Give your final answer inside <answer></answer>."
    assert reward(out, test[0], "<answer> rome. </answer>") == 1.0


def test_a_hub_dataset_is_read_from_the_hugging_face_cache_offline(tmp_path, monkeypatch):
    """The tests run with HF_HUB_OFFLINE=1 (conftest); the Hub cache holds demo/quiz as `hf download` leaves it."""
    import huggingface_hub

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "datasets--demo--quiz"
    (repo / "snapshots" / commit / "data").mkdir(parents=True)
    rows = [{"q": "Capital of Italy?", "a": "Rome"}, {"q": "Capital of Peru?", "a": "Lima"}]
    (repo / "snapshots" / commit / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    made = hubgym("wrap", "demo/quiz", "--prompt", "q", "--answer", "a", "--reward", "exact",
                  "--out", tmp_path / "quiz")
    assert made.exit_code == 0, made.output
    assert f"'demo/quiz', revision '{commit}'" in (tmp_path / "quiz" / "builder.py").read_text()
    assert build_tasks(str(tmp_path / "quiz"))["train"][0]["info"] == {"answer": "Rome"}
    absent = refused(tmp_path, WrapSpec("demo/absent", "q", "a", "exact", tmp_path / "absent"))
    assert absent.what == ("cannot read dataset 'demo/absent': it is not a folder, and HF_HUB_OFFLINE is set but the "
                           "Hugging Face cache does not hold it (LocalEntryNotFoundError)")
    assert absent.fix == "download it once (hf download demo/absent --repo-type dataset), or unset HF_HUB_OFFLINE"


def test_a_single_data_file_is_a_train_split(tmp_path):
    out = wrap_dataset(WrapSpec(str(CAPITALS / "test.jsonl"), "question", "answer", "choice", tmp_path / "peru",
                                choices="choices"))
    assert resolve_env(str(out)).ENV == "test" and len(build_tasks(str(out))["train"]) == 4


def test_a_config_of_a_dataset_laid_out_like_a_hub_repo(tmp_path):
    source = tmp_path / "levels"
    for level, answer in (("easy", "2"), ("hard", "144")):
        (source / level).mkdir(parents=True)
        (source / level / "train.jsonl").write_text(json.dumps({"q": f"a {level} one", "a": answer}) + "\n")
    (source / "README.md").write_text("---\nconfigs:\n" + "".join(
        f"- config_name: {level}\n  data_files:\n  - split: train\n    path: {level}/train.jsonl\n"
        for level in ("easy", "hard")) + "---\n")
    out = wrap_dataset(WrapSpec(str(source), "q", "a", "numeric", tmp_path / "hard", config="hard"))
    assert build_tasks(str(out))["train"]["info"] == [{"answer": "144"}]
    assert "--config hard" in (out / "README.md").read_text()


# -- bad input: one clear error each, nothing written ---------------------------------------------------------------

def refused(tmp_path, spec: WrapSpec) -> EnvContractError:
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(EnvContractError) as info:
        wrap_dataset(spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no env folder, no staging folder left
    return info.value


def folder_of(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_a_dataset_that_cannot_be_read(tmp_path):
    missing = refused(tmp_path, WrapSpec(str(tmp_path / "nowhere"), "q", "a", "exact", tmp_path / "out"))
    assert missing.what == f"cannot read dataset {str(tmp_path / 'nowhere')!r}: there is no such folder or file"
    assert missing.where == Where("nowhere", field="DATASET") and "Parquet/JSON/CSV" in missing.fix
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "train.parquet").write_bytes(b"not parquet")
    error = refused(tmp_path, WrapSpec(str(corrupt), "q", "a", "exact", tmp_path / "out"))
    assert error.what.startswith(f"cannot read dataset {str(corrupt)!r}: ArrowInvalid")


def test_a_missing_column_names_the_columns_that_exist(tmp_path):
    source = folder_of(tmp_path, "quiz", [{"question": "2+2?", "solution": "4"}])
    error = refused(tmp_path, WrapSpec(str(source), "question", "answer", "exact", tmp_path / "out"))
    assert str(error) == ("the dataset has no column 'answer'; its columns are ['question', 'solution'] "
                          "[env='quiz' split='train' field='answer']. Fix: pass --answer with one of "
                          "['question', 'solution']")


def test_a_column_of_the_wrong_type_names_the_row_and_field(tmp_path):
    error = refused(tmp_path, WrapSpec(str(CAPITALS), "choices", "answer", "exact", tmp_path / "out"))
    assert error.what.startswith("column 'choices' holds List(Value('string')), not text (a string) (row 0 is "
                                 "['Berlin', 'Paris', 'Madrid', 'Rome'])")
    assert error.where == Where("capitals", None, "train", "row 0", "choices")
    spec = WrapSpec(str(CAPITALS), "question", "choices", "choice", tmp_path / "out", choices="answer")
    error = refused(tmp_path, spec)
    assert error.what.startswith("column 'choices' holds List(Value('string')), not a 0-based index (an integer) or a "
                                 "letter")
    source = folder_of(tmp_path, "gaps", [{"q": "a?", "a": "1"}, {"q": None, "a": "2"}])
    error = refused(tmp_path, WrapSpec(str(source), "q", "a", "exact", tmp_path / "out"))
    assert error.what == "the prompt is empty (None)" and error.where == Where("gaps", None, "train", "row 1", "q")


def test_answers_the_reward_cannot_read(tmp_path):
    error = refused(tmp_path, WrapSpec(str(GSM8K), "question", "answer", "numeric", tmp_path / "out"))
    assert "does not hold exactly one number" in error.what and error.where.row == "row 0"
    assert error.fix == "take the number after '####' with --answer-regex '####\\s*(.+)$'"
    spec = WrapSpec(str(GSM8K), "question", "answer", "exact", tmp_path / "out", answer_regex="@@(.+)")
    error = refused(tmp_path, spec)
    assert error.what.startswith("--answer-regex '@@(.+)' does not match the answer") and error.where.field == "answer"
    source = folder_of(tmp_path, "mcq", [{"q": "Pick", "c": ["x", "y"], "a": 2}])
    error = refused(tmp_path, WrapSpec(str(source), "q", "a", "choice", tmp_path / "out", choices="c"))
    assert error.what == "the answer 2 names none of the row's 2 choices"
    assert error.fix == "give a 0-based index below 2 or a letter from A to B in the answer column"


def test_an_empty_dataset(tmp_path):
    source = tmp_path / "empty"
    source.mkdir()
    (source / "train.csv").write_text("q,a\n")
    error = refused(tmp_path, WrapSpec(str(source), "q", "a", "exact", tmp_path / "out"))
    assert error.what == f"dataset {str(source)!r} is empty: its data files hold no rows"
    pq.write_table(pa.table({"q": pa.array([], pa.string()), "a": pa.array([], pa.string())}),
                   source / "train.parquet")
    (source / "train.csv").unlink()
    assert "is empty" in refused(tmp_path, WrapSpec(str(source), "q", "a", "exact", tmp_path / "out")).what


@pytest.mark.slow
def test_an_out_folder_that_is_not_empty_is_refused_unless_forced(tmp_path):
    out = tmp_path / "capitals"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["wrap", CAPITALS, "--prompt", "question", "--choices", "choices", "--answer", "answer", "--reward",
            "choice", "--out", out]
    result = hubgym(*args)
    assert result.exit_code == 1 and (out / "notes.txt").read_text() == "mine"
    assert re.sub(r"\s+", " ", result.output).startswith(
        f"error: --out {out} exists and is not empty; hubgym wrap never overwrites files unless told")
    forced = hubgym(*args, "--force")
    assert forced.exit_code == 0, forced.output
    assert not (out / "notes.txt").exists() and (out / "builder.py").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["capitals"]  # no staging or set-aside folder left


def test_bad_options_are_refused_before_the_source_is_read(tmp_path):
    taken = refused(tmp_path, WrapSpec("openai/gsm8k", "question", "answer", "exact", tmp_path / "out"))
    assert taken.what == "env name 'gsm8k' is taken by a built-in environment" and taken.where.field == "--name"
    assert taken.fix.endswith("e.g. --name gsm8k_wrapped")
    no_choices = refused(tmp_path, WrapSpec(str(CAPITALS), "question", "answer", "choice", tmp_path / "out"))
    assert no_choices.what == "--reward choice needs the column of choices"
    unknown_split = refused(tmp_path, WrapSpec(str(CAPITALS), "question", "answer", "choice", tmp_path / "out",
                                               choices="choices", split_map={"test": "validation"}))
    assert unknown_split.what == "the dataset has no split 'validation'; it has ['test', 'train']"
    result = hubgym("wrap", CAPITALS, "--prompt", "question", "--answer", "answer", "--reward", "exact",
                    "--split-map", "test", "--out", tmp_path / "out")
    assert result.exit_code == 1 and "--split-map entry 'test' is not ENV_SPLIT=SOURCE_SPLIT" in result.output


def test_a_gold_answer_its_verifier_cannot_read_leaves_nothing_behind(tmp_path):
    rows = [{"q": "Half of one?", "a": "\\frac{1}{2}"}, {"q": "Broken", "a": "\\frac{"}]
    source = folder_of(tmp_path, "halves", rows)
    error = refused(tmp_path, WrapSpec(str(source), "q", "a", "math_verify", tmp_path / "out"))
    assert error.what.startswith("the gold answer '\\\\frac{' scores 0.0") and error.where == Where(
        "halves", None, "train", "row 1", "a")
    assert error.fix == "fix the row, or use --reward exact when the answers are text rather than math"


@pytest.mark.slow
def test_rows_with_the_same_question_and_gold_answer_are_one_task(tmp_path):
    rows = [{"q": "How many?", "a": "Two and two.\n#### 4"}, {"q": "How many?", "a": "Four.\n#### 4"},
            {"q": "How many?", "a": "#### 5"}]
    source = folder_of(tmp_path, "counts", rows)
    out = wrap_dataset(WrapSpec(str(source), "q", "a", "numeric", tmp_path / "out", answer_regex=GSM8K_REGEX))
    assert build_tasks(str(out))["train"]["info"] == [{"answer": "4"}, {"answer": "5"}]
