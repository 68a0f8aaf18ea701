"""`tokens_consistent` is the token audit's verdict, row for row, on real vLLM rollouts of the tiny model: one check
(`hubgym.rollout.tokens.audit_tokens`) decides both when a row is written and when `hubgym replay` audits it.

The random tiny model often samples special tokens (`<|im_start|>`, ...) inside a reply. The engine keeps them in
the reply's text, so those rows are consistent; an engine whose text leaves them out (vLLM's default, and what
hubgym stored before) makes rows whose text and ids disagree, and exactly those rows are flagged as written."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from hubgym.hub.rollouts import iter_rollouts
from hubgym.engines import SamplingArgs, VLLMEngine
from hubgym.rollout.run import RolloutConfig, run_rollouts
from hubgym.rollout.tokens import ChatRenderer
from hubgym.score.replay import audit_tokens, replay

pytestmark = pytest.mark.slow
ENVS = ["arithmetic:easy", "calc_tools", "wordle"]  # one reply; tools in the prompt; env observations between turns


class SpecialsDropped:
    """The real engine, with the special tokens left out of each reply's text, as vLLM does by default."""

    def __init__(self, engine: VLLMEngine):
        self.engine, self.tokenizer = engine, engine.tokenizer
        self.name, self.version, self.model = engine.name, engine.version, engine.model
        self.max_model_len, self.token_in = engine.max_model_len, engine.token_in

    async def generate(self, request, sampling):
        samples = await self.engine.generate(request, sampling)
        for sample in samples:
            for special in self.tokenizer.all_special_tokens:
                sample.text = sample.text.replace(special, "")
        return samples

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def runs(tiny_model, tmp_path_factory) -> dict[str, list[dict]]:
    out = tmp_path_factory.mktemp("audit")
    engine = VLLMEngine(str(tiny_model), max_model_len=2048)
    for name, used in (("kept", engine), ("dropped", SpecialsDropped(engine))):
        run_rollouts(RolloutConfig(envs=ENVS, model=str(tiny_model), out=str(out / name), n=4, limit=4,
                                   sampling=SamplingArgs(max_tokens=48), max_model_len=2048), engine=used,
                     progress=False)
    engine.close()
    return {name: list(iter_rollouts([out / name])) for name in ("kept", "dropped")}


@pytest.fixture(scope="module")
def renderer(tiny_model) -> ChatRenderer:
    return ChatRenderer(AutoTokenizer.from_pretrained(str(tiny_model)))


def specials_inside_a_reply(row: dict, renderer: ChatRenderer) -> bool:
    """A special token the model sampled that is not the end of turn it stopped on."""
    tokenizer = renderer.tokenizer
    inside = set(tokenizer.all_special_ids) - {tokenizer.eos_token_id}
    return any(m == 1 and t in inside for t, m in zip(row["completion_ids"], row["completion_mask"]))


@pytest.mark.parametrize("name", ["kept", "dropped"])
def test_every_stored_tokens_consistent_is_the_audits_verdict(runs, renderer, name):
    rows = runs[name]

    assert len(rows) == 4 * 4 * len(ENVS)
    assert [(r["rollout_id"], r["tokens_consistent"]) for r in rows] == [
        (r["rollout_id"], audit_tokens(r, renderer).ok) for r in rows]


def test_special_tokens_sampled_inside_a_reply_stay_in_its_text(runs, renderer):
    kept = runs["kept"]
    with_specials = [r for r in kept if specials_inside_a_reply(r, renderer)]

    assert with_specials  # the random model samples them: the case is really exercised
    assert all(r["tokens_consistent"] for r in kept)
    for row in with_specials:  # the text says what the ids say
        replies = "".join(m["content"] or "" for m in row["completion"] if m["role"] == "assistant")
        assert any(special in replies for special in renderer.tokenizer.all_special_tokens)


def test_rows_whose_text_lost_sampled_tokens_are_flagged_when_written(runs, renderer, tiny_model):
    dropped = runs["dropped"]
    flagged = {r["rollout_id"] for r in dropped if not r["tokens_consistent"]}

    assert flagged and flagged == {r["rollout_id"] for r in dropped if specials_inside_a_reply(r, renderer)}
    report = replay(dropped, model=tiny_model)  # `hubgym replay` reports the very same rows
    assert {r.rollout_id for r in report.token_failures} == flagged
    assert all(r.audit.part == "model" for r in report.token_failures)  # the mismatch is in a sampled reply
