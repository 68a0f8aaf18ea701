"""The `reverse_text` env: real builds, held-out test texts, golden cases, and graded similarity."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubgym
from hubgym.builders.reverse_text import WORDS, ReverseText, held_out
from hubgym.errors import EnvContractError, Where
from hubgym.schemas import assistant, make_task, tool_call, user, validate_tasks
from hubgym.verifiers import reverse_text as rv
from hubgym.verifiers.rewards import similarities, similarity

VERIFIER = ReverseText.verifier()
TARGET = "tnahpele"  # "elephant" reversed


def _task(text="elephant"):
    return make_task("reverse_text", [user(f"Reverse this text: {text}")], {"text": text, "target": text[::-1]})


def _score(reply, text="elephant"):
    return VERIFIER.score(_task(text), [assistant(reply)]).reward


@pytest.fixture(scope="module", params=ReverseText.config_names())
def built(request):
    return request.param, hubgym.build_tasks("reverse_text", request.param)


@pytest.mark.slow
def test_builds_valid_rows_with_held_out_texts(built):
    config, ds = built
    low, high = {"words": (1, 3), "sentences": (6, 12)}[config]
    for split, rows in ds.items():
        validate_tasks(rows.data.table, Where("reverse_text", config, split))
        assert len(rows) == len(set(rows["id"])) == {"train": 1000, "test": 100}[split]
        assert {i["kind"] for i in rows["interaction"]} == {"single_turn"}
        for prompt, info in zip(rows["prompt"], rows["info"]):
            text = info["text"]
            assert info["target"] == text[::-1] and prompt[-1]["content"].endswith(text)
            assert held_out(text) == (split != "train")
            words = text.rstrip(".").lower().split()
            assert low <= len(words) <= high and set(words) <= set(WORDS)
            assert (text[0].isupper() and text.endswith(".")) == (config == "sentences")
    assert not {i["text"] for i in ds["train"]["info"]} & {i["text"] for i in ds["test"]["info"]}


@pytest.mark.slow
def test_ids_are_deterministic():
    first, second = (hubgym.build_tasks("reverse_text", "words")["test"] for _ in range(2))
    assert first["id"] == second["id"] and first["info"] == second["info"]


def test_bad_word_range_and_oversized_split_name_field_and_fix(tmp_path):
    builder = ReverseText(config_name="words", min_words=3, max_words=2, cache_dir=str(tmp_path / "a"))
    with pytest.raises(EnvContractError) as err:
        next(builder.generate_tasks("train", size=1, seed=0))
    assert err.value.where == Where("reverse_text", "words", "train", field="min_words")
    builder = ReverseText(config_name="words", max_words=1, cache_dir=str(tmp_path / "b"))
    with pytest.raises(EnvContractError) as err:
        next(builder.generate_tasks("test", size=len(WORDS), seed=0))
    assert err.value.where.field == "sizes" and "sizes['test'] <=" in err.value.fix


def test_golden_cases_score_as_declared():
    cases = ReverseText.golden_cases()
    assert {c.reward for c in cases} >= set(VERIFIER.reward_range)
    assert any(0.0 < c.reward < 1.0 for c in cases)
    for case in cases:
        assert VERIFIER.score(case.task, case.completion).reward == case.reward, case.name


def test_near_misses_earn_graded_partial_credit():
    exact, one_off = _score(f"<reversed>{TARGET}</reversed>"), _score("tnahpela")
    two_off = _score("<reversed>tnahpxla</reversed>")
    assert exact == 1.0 and one_off == 0.875 and two_off == 0.75
    unreversed = _score("<reversed>elephant</reversed>")
    assert unreversed < two_off  # the original text is a poor answer, not a free pass
    assert _score("<reversed>Tnahpele</reversed>") == 0.875  # case counts
    assert _score("<reversed>TNAHPELE</reversed>") == 0.0


def test_answer_is_the_tag_else_the_whole_reply():
    assert rv.answer_of([assistant(f"Sure! <reversed> {TARGET} </reversed> Done.")]) == TARGET
    assert rv.answer_of([assistant(f"<reversed>x</reversed><reversed>{TARGET}</reversed>")]) == TARGET
    assert rv.answer_of([assistant(f"  {TARGET}\n")]) == TARGET
    assert rv.answer_of([assistant(TARGET), assistant(None, [tool_call("c1", "python", "{}")])]) == TARGET
    score = VERIFIER.score(_task(), [assistant(f"The reversed text is {TARGET}")])
    assert 0.0 < score.reward < 1.0 and score.components["exact"] == 0.0 and score.components["formatted"] == 0.0
    assert VERIFIER.score(_task(), [assistant(TARGET)]).components == {
        "answer_found": 1.0, "reversal": 1.0, "exact": 1.0, "formatted": 0.0}
    assert _score("") == 0.0 and _score("<reversed></reversed>") == 0.0


def test_sentence_reversal_keeps_spaces_and_punctuation():
    text = "Quiet river under the bridge."
    assert _score(f"<reversed>{text[::-1]}</reversed>", text) == 1.0
    assert 0.9 < _score(f"<reversed>{text[::-1].lstrip('.')}</reversed>", text) < 1.0  # the period dropped: a near miss
    words_reversed = " ".join(reversed(text.split()))  # word order reversed, letters not: mostly wrong
    assert _score(f"<reversed>{words_reversed}</reversed>", text) < 0.5


@settings(max_examples=60, deadline=None)
@given(pairs=st.lists(st.tuples(st.text(max_size=30), st.text(max_size=30)), max_size=20))
def test_a_batch_of_similarities_is_each_pairs_similarity_to_the_last_bit(pairs):
    """`reversal` scores a batch in one rapidfuzz call: each value is the very double one call per pair gives."""
    texts, targets = [a for a, _ in pairs], [b for _, b in pairs]
    assert similarities(texts, targets) == [similarity(a, b) for a, b in pairs]
