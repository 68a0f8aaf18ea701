"""The `gsm8k` env: the shipped fixture, the Hub loading path (on a local copy laid out like
openai/gsm8k), the offline fallback, golden cases, and answer equivalence."""

import json
from pathlib import Path

import datasets
import huggingface_hub
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hubgym
from hubgym.builders.gsm8k import FIXTURE, GSM8K, HUB_REPO
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import assistant, make_task, tool_call, user, validate_tasks
from hubgym.verifiers import gsm8k as gv

VERIFIER = GSM8K.verifier()


def _fixture_rows(split):
    return [json.loads(line) for line in (FIXTURE / f"{split}.jsonl").read_text().splitlines()]


def _hub_layout(folder: Path, subsets: dict[str, dict[str, list[dict]]]) -> Path:
    """A folder laid out like the openai/gsm8k repo: README configs, <subset>/<split>-00000-of-00001.parquet."""
    for subset, splits in subsets.items():
        (folder / subset).mkdir(parents=True)
        for split, rows in splits.items():
            pq.write_table(pa.Table.from_pylist(rows), folder / subset / f"{split}-00000-of-00001.parquet")
    configs = "".join(f"- config_name: {subset}\n  data_files:\n"
                      + "".join(f"  - split: {split}\n    path: {subset}/{split}-*\n" for split in splits)
                      for subset, splits in subsets.items())
    (folder / "README.md").write_text(f"---\nconfigs:\n{configs}---\n# gsm8k (local copy)\n")
    return folder


def _build(tmp_path, config="tiny", **overrides):
    builder = GSM8K(config_name=config, cache_dir=str(tmp_path / "cache"), **overrides)
    builder.download_and_prepare(verification_mode="no_checks")
    return builder.as_dataset()


def _task(answer):
    return make_task("gsm8k", [user("q")], {"answer": answer, "solution": "worked"})


@pytest.fixture(scope="module")
def tiny():
    return hubgym.build_tasks("gsm8k")


def test_tiny_fixture_builds_valid_rows(tiny):
    assert GSM8K.config_names()[0] == "tiny"
    for split, size in (("train", 12), ("test", 8)):
        rows = tiny[split]
        validate_tasks(rows.data.table, Where("gsm8k", "tiny", split))
        assert len(rows) == len(set(rows["id"])) == size and set(rows["split"]) == {split}
        assert {i["kind"] for i in rows["interaction"]} == {"single_turn"}
        source = _fixture_rows(split)
        assert [p[-1]["content"] for p in rows["prompt"]] == [r["question"] for r in source]
        assert [i["answer"] for i in rows["info"]] == [r["answer"].rsplit("####", 1)[1].strip() for r in source]
        assert all("####" not in i["solution"] and "<<" in i["solution"] for i in rows["info"])
    assert not set(tiny["train"]["id"]) & set(tiny["test"]["id"])


def test_ids_are_deterministic(tiny):
    again = hubgym.build_tasks("gsm8k", "tiny")
    assert again["train"]["id"] == tiny["train"]["id"] and again["test"]["info"] == tiny["test"]["info"]


def test_main_loads_the_hub_repo_layout(tmp_path):
    assert next(c for c in GSM8K.BUILDER_CONFIGS if c.name == "main").source == HUB_REPO == "openai/gsm8k"
    train, test = _fixture_rows("train"), _fixture_rows("test")
    socratic = [{**r, "question": "Socratic: " + r["question"]} for r in train[:2]]
    repo = _hub_layout(tmp_path / "gsm8k", {"main": {"train": train[:5], "test": test[:3]},
                                            "socratic": {"train": socratic, "test": socratic}})
    built = _build(tmp_path, "main", source=str(repo))
    assert (len(built["train"]), len(built["test"])) == (5, 3)
    assert not any("Socratic" in p[-1]["content"] for p in built["train"]["prompt"])  # the "main" config only
    tiny = _build(tmp_path / "t")  # same problems, same content hashes
    assert built["train"]["id"] == tiny["train"]["id"][:5] and built["test"]["id"] == tiny["test"]["id"][:3]
    sub = _build(tmp_path / "s", "main", source=str(repo), subset="socratic")
    assert all(p[-1]["content"].startswith("Socratic: ") for p in sub["train"]["prompt"])


def test_main_offline_falls_back_to_the_fixture_with_a_warning(monkeypatch, tiny):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.warns(UserWarning, match=r"HF_HUB_OFFLINE is set, so the build uses the shipped gsm8k_tiny "
                                         r"fixture \(20 problems\) instead of 'openai/gsm8k'"):
        built = hubgym.build_tasks("gsm8k", "main")
    assert built["train"]["id"] == tiny["train"]["id"] and built["test"]["id"] == tiny["test"]["id"]


def test_main_falls_back_at_once_when_the_hub_does_not_answer(monkeypatch, tiny):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.warns(UserWarning, match=r"'main': the Hub is unreachable \(ConnectError: .*\), so the build uses "
                                         r"the shipped gsm8k_tiny fixture"):
        built = hubgym.build_tasks("gsm8k", "main")
    assert built["test"]["id"] == tiny["test"]["id"]


def test_sizes_cap_with_a_seeded_sample(tmp_path, tiny):
    first = _build(tmp_path / "a", sizes={"train": 5, "test": 8})
    second = _build(tmp_path / "b", sizes={"train": 5, "test": 8})
    other_seed = _build(tmp_path / "c", sizes={"train": 5, "test": 8}, seed=1)
    assert len(first["train"]) == 5 and first["train"]["id"] == second["train"]["id"]
    assert set(first["train"]["id"]) < set(tiny["train"]["id"]) and first["test"]["id"] == tiny["test"]["id"]
    assert set(other_seed["train"]["id"]) != set(first["train"]["id"])


def test_malformed_source_row_names_row_field_and_fix(tmp_path):
    rows = datasets.Dataset.from_list([_fixture_rows("train")[0], {"question": "How many?", "answer": "Some."}])
    builder = GSM8K(config_name="tiny", cache_dir=str(tmp_path))
    with pytest.raises(EnvContractError) as err:
        list(builder.generate_tasks("train", rows=rows, size=10, seed=0))
    assert err.value.where == Where("gsm8k", "tiny", "train", "row 1", "answer")
    assert "ending '#### <number>'" in err.value.what and "openai/gsm8k format" in err.value.fix


def test_missing_split_is_a_clear_error(tmp_path):
    repo = _hub_layout(tmp_path / "gsm8k", {"main": {"train": _fixture_rows("train")[:2]}})
    with pytest.raises(EnvContractError, match=r"the source has no split 'test' \(it has \['train'\]\)"
                                               r".*field='sizes'.*Fix: list only the source's splits"):
        _build(tmp_path, "main", source=str(repo))


def test_golden_cases_score_as_declared():
    cases = GSM8K.golden_cases()
    assert {c.reward for c in cases} >= set(VERIFIER.reward_range)
    for case in cases:
        assert VERIFIER.score(case.task, case.completion).reward == case.reward, case.name


@pytest.mark.slow
@pytest.mark.parametrize("reply, gold", [
    ("<answer>18</answer>", "18"), ("<answer>18.0</answer>", "18"), ("<answer>$18</answer>", "18"),
    ("<answer>18 dollars</answer>", "18"), ("\\boxed{\\frac{36}{2}}", "18"), ("so it is 18.00", "18"),
    ("<answer>1,000</answer>", "1000"), ("<answer>\\$1,000.</answer>", "1000"), ("Steps...\n#### 1,000", "1000"),
    ("<answer>0.5</answer>", "0.5"), ("<answer>1/2</answer>", "0.5"), ("<answer>-7</answer>", "-7"),
])
def test_equivalent_answers_are_correct(reply, gold):
    assert gv.correct([_task(gold)], [[assistant(reply)]]) == [1.0]


@pytest.mark.parametrize("reply, gold", [
    ("<answer>17 or 18</answer>", "18"),  # hedging is not an answer
    ("<answer>-18</answer>", "18"),
    ("<answer>18</answer>", "1000"),
    ("I think 18 at first, but then 17", "18"),  # the last number counts
    ("<answer>eighteen</answer>", "18"),
    ("", "18"),
])
def test_wrong_or_missing_answers_earn_nothing(reply, gold):
    assert gv.correct([_task(gold)], [[assistant(reply)]]) == [0.0]


def test_a_batch_checks_each_answer_against_its_own_gold():
    """An answer repeated in a batch is checked once per gold: the same text is right for one row, wrong for
    another; a batch gives what each row gives alone."""
    tasks = [_task("18"), _task("1000"), _task("18"), _task("0.5")]
    replies = ("<answer>18</answer>", "<answer>18</answer>", "18", "<answer>1/2</answer>")
    completions = [[assistant(reply)] for reply in replies]
    assert gv.correct(tasks, completions) == [1.0, 0.0, 1.0, 1.0]
    assert gv.correct(tasks, completions) == [gv.correct([t], [c])[0] for t, c in zip(tasks, completions)]


def test_extraction_priority_and_final_turn():
    assert gv.extract("#### 3 but <answer>4</answer> and \\boxed{5}") == "4"
    assert gv.extract("\\boxed{5} then #### 6") == "5"
    assert gv.extract("#### 6\nthen 7") == "6"
    assert gv.extract("no numbers") is None
    completion = [assistant("<answer>18</answer>"), assistant(None, [tool_call("c1", "calculator", "{}")])]
    assert gv.correct([_task("18")], [completion]) == [1.0]  # a trailing tool call is not the final answer
    assert VERIFIER.score(_task("18"), [assistant("18")]).components == {"answer_found": 1.0, "correct": 1.0,
                                                                          "formatted": 0.0}
