"""hubgym envs inside TRL's GRPOTrainer: the dataset, reward functions and environment TRL takes, and TRL's own
trainer running 2 steps on the CPU whose logged rewards equal hubgym's verifier on the same completions."""

from __future__ import annotations

import json
import os

import pytest

from hubgym.envs import resolve_env
from hubgym.integrations.trl import ACT_NOTE, TASK_COLUMN, from_trl_completion, played_through_act, trl_env
from hubgym.schemas.messages import assistant
from hubgym.verifiers.act import EPISODE_OVER, NO_TURNS_LEFT, NOT_TEXT, env_view

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
GUESS = "slate"  # the move the tiny model is steered to make


def total(env, funcs_out: list[list[float | None]], i: int) -> float:
    return sum(w * out[i] for w, out in zip(env.reward_weights, funcs_out))


def call_rewards(env, completions, rows, environments=None):
    tasks = [row[TASK_COLUMN] for row in rows]
    return [f(prompts=[r["prompt"] for r in rows], completions=completions, hubgym_task=tasks,
              environments=environments) for f in env.reward_funcs]


def test_weighted_reward_functions_add_up_to_the_verifier_score():
    env = trl_env("arithmetic:easy", split="test", limit=3)
    rows = list(env.train_dataset)
    assert [json.loads(r[TASK_COLUMN])["id"] for r in rows] == [t["id"] for t in env.tasks]
    assert rows[0]["prompt"] == [{"role": m["role"], "content": m["content"]} for m in env.tasks[0]["prompt"]]
    answers = [json.loads(r[TASK_COLUMN])["info"]["answer"] for r in rows]
    texts = [f"<answer>{answers[0]}</answer>", "no idea", f"<answer>{int(answers[2]) + 1}</answer>"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    out = call_rewards(env, completions, rows)
    assert [f.__name__ for f in env.reward_funcs] == [name for name, _ in env.components]
    for i, task in enumerate(env.tasks):
        expected = env.verifier.score(task, [assistant(texts[i])])
        assert total(env, out, i) == pytest.approx(expected.reward)
    assert [total(env, out, i) for i in range(3)] == [1.0, 0.0, 0.0]
    assert env.environment_factory is None and "environment_factory" not in env.trainer_kwargs()


def test_a_verifier_error_is_none_for_every_function_never_a_reward():
    env = trl_env("arithmetic:easy", split="test", limit=1)
    row = dict(env.train_dataset[0])
    broken = json.loads(row[TASK_COLUMN])
    del broken["info"]["answer"]  # the verifier raises a KeyError on this row
    out = call_rewards(env, [[{"role": "assistant", "content": "<answer>1</answer>"}]],
                       [{**row, TASK_COLUMN: json.dumps(broken)}])
    assert [o[0] for o in out] == [None] * len(env.reward_funcs)


def test_multi_turn_golden_games_through_act_earn_their_golden_reward():
    env = trl_env("wordle", split="test", limit=1)
    factory = env.environment_factory
    assert "act" in dict(vars(factory)) and [n for n, _ in env.components][-1] == "steps"
    cases = resolve_env("wordle").golden_cases()
    row = dict(env.train_dataset[0])
    assert ACT_NOTE in row["prompt"][-1]["content"]  # the prompt says a move is a call of act
    for case in cases:
        task = {**json.loads(row[TASK_COLUMN]), "info": case.task["info"], "interaction": {
            **json.loads(row[TASK_COLUMN])["interaction"], **case.task["interaction"]}}
        instance = factory()
        assert instance.reset(prompt=row["prompt"], **{TASK_COLUMN: json.dumps(task)}) is None
        completion = []  # what TRL's tool loop leaves: each act call and its result
        for action in case.actions:
            result = instance.act(action=action)
            completion += [{"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "act", "arguments": {"action": action}}}]},
                           {"role": "tool", "name": "act", "content": result}]
        completion.append({"role": "assistant", "content": "<guess>words outside act are no move</guess>"})
        out = call_rewards(env, [completion], [{**row, TASK_COLUMN: json.dumps(task)}], [instance])
        assert total(env, out, 0) == pytest.approx(case.reward), case.name
        stepped = env_view(env.verifier, played_through_act(task), from_trl_completion(completion))
        assert stepped == instance.trajectory  # the env's own record and the completion read the same episode
    assert instance.act(action="<guess>crane</guess>") in (EPISODE_OVER, NO_TURNS_LEFT)
    assert instance.act(action=5) == NOT_TEXT


def test_a_multi_turn_env_with_a_reset_observation_opens_with_it_as_a_user_turn():
    env = trl_env("tictactoe", split="test", limit=1)
    task = env.tasks[0]
    _, observation = env.verifier.reset(task)
    prompt = env.train_dataset[0]["prompt"]
    assert observation and prompt[-1] == {"role": "user", "content": observation}
    assert prompt[-2]["content"].endswith(ACT_NOTE)
    assert repr(env).startswith("TRLEnv(tictactoe:") and len(repr(env)) < 200


def test_tool_use_tools_are_methods_that_run_hubgym_tools_and_shape_the_reward():
    env = trl_env("calc_tools:calculator", split="test", limit=1)
    instance = env.environment_factory()
    row = dict(env.train_dataset[0])
    assert instance.reset(**row) is None
    import inspect

    assert list(inspect.signature(instance.calculator).parameters) == ["expression"]
    assert instance.calculator(expression="6 * 7") == "42"
    assert instance.calculator(expression="6 *").startswith("Error: ")
    answer = json.loads(row[TASK_COLUMN])["info"]["answer"]
    trl_completion = [  # what TRL's tool loop leaves: parsed argument dicts, tool results by name
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}]},
        {"role": "tool", "name": "calculator", "content": "42"},
        {"role": "assistant", "content": f"<answer>{answer}</answer>"},
    ]
    hubgym_completion = from_trl_completion(trl_completion)
    assert hubgym_completion[0]["tool_calls"][0] == {"id": "call-0-0", "name": "calculator",
                                                      "arguments": '{"expression": "6 * 7"}'}
    assert hubgym_completion[1]["tool_call_id"] == "call-0-0"
    out = call_rewards(env, [trl_completion], [row], [instance])
    expected = env.verifier.score(env.tasks[0], hubgym_completion)
    assert total(env, out, 0) == pytest.approx(expected.reward) == pytest.approx(1.1)


# -- TRL's own trainer ---------------------------------------------------------------------------------------------

def recorder(env, seen: list):
    """A weight-0 reward function that keeps, per step, what hubgym's verifier must score: each task (as TRL plays
    it: a multi_turn one through `act`) with TRL's completion in hubgym's messages."""

    def record(prompts, completions, hubgym_task, environments=None, **_):
        seen.append([(played_through_act(json.loads(t)), from_trl_completion(c))
                     for t, c in zip(hubgym_task, completions)])
        return [0.0] * len(completions)

    return record


def run_trl(env, model, tokenizer, tmp_path, generation_kwargs=None, max_tokens=48):
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    logs, seen = [], []

    class KeepLogs(TrainerCallback):
        def on_log(self, args, state, control, logs_=None, **kwargs):
            if kwargs.get("logs") and "reward" in kwargs["logs"]:
                logs.append(dict(kwargs["logs"]))

    kwargs = env.trainer_kwargs()
    kwargs["reward_funcs"] = kwargs["reward_funcs"] + [recorder(env, seen)]
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=2, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=max_tokens, learning_rate=1e-3, logging_steps=1, report_to="none",
                      use_cpu=True, seed=0, reward_weights=env.reward_weights + [0.0], save_strategy="no", bf16=False,
                      max_tool_calling_iterations=3, disable_tqdm=True,
                      generation_kwargs=generation_kwargs)
    trainer = GRPOTrainer(str(model), args=args, processing_class=tokenizer, callbacks=[KeepLogs()], **kwargs)
    trainer.train()
    return logs, seen


def assert_logged_rewards_are_hubgym_scores(env, logs, seen):
    assert len(logs) == len(seen) == 2  # one generation batch per step, logged every step
    for log, batch in zip(logs, seen):
        scores = [env.verifier.score(task, trajectory) for task, trajectory in batch]
        assert all(s.reward is not None for s in scores)
        assert log["reward"] == pytest.approx(sum(s.reward for s in scores) / len(scores), abs=1e-6)
        for name, _ in env.components:
            mean = sum(s.components[name] for s in scores) / len(scores)
            assert log[f"rewards/{name}/mean"] == pytest.approx(mean, abs=1e-6), name


@pytest.mark.slow
def test_trl_grpo_trains_a_single_turn_env_with_hubgym_rewards(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    env = trl_env("arithmetic:tiny", split="train", limit=4)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    logs, seen = run_trl(env, tiny_model, tokenizer, tmp_path)
    assert_logged_rewards_are_hubgym_scores(env, logs, seen)
    assert all(len(batch) == 4 for batch in seen)


@pytest.mark.slow
def test_trl_grpo_plays_a_multi_turn_env_through_act_with_hubgym_rewards(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    from hubgym.integrations.trl import tool_parsing_tokenizer

    env = trl_env("wordle", split="train", limit=4)
    tokenizer = tool_parsing_tokenizer(AutoTokenizer.from_pretrained(tiny_model, padding_side="left"))
    logs, seen = run_trl(env, tiny_model, tokenizer, tmp_path, generation_kwargs=steer_to_act(tokenizer),
                         max_tokens=160)  # room for the act call, its result and the next turn
    assert_logged_rewards_are_hubgym_scores(env, logs, seen)
    played = [env_view(env.verifier, task, completion) for batch in seen for task, completion in batch]
    assert all(traj[0] == assistant(f"<guess>{GUESS}</guess>") for traj in played)  # act was called: games played
    assert any(log["rewards/steps/mean"] > 0 for log in logs)  # and earned step rewards


def steer_to_act(tokenizer) -> dict:
    """Generation settings that make the random-weight tiny model reply with a Hermes tool call of `act` (it never
    calls a tool by itself): transformers' `sequence_bias`, one entry per prefix of the call's tokens, each longer
    prefix biased more, so each next token of the call wins once the tokens before it were sampled."""
    call = json.dumps({"name": "act", "arguments": {"action": f"<guess>{GUESS}</guess>"}})
    ids = tokenizer(f"<tool_call>\n{call}\n</tool_call>{tokenizer.eos_token}", add_special_tokens=False)["input_ids"]
    return {"sequence_bias": [[ids[:k + 1], 100.0 + 10.0 * k] for k in range(len(ids))]}


@pytest.mark.slow
def test_a_hermes_template_gets_a_tool_call_parser_trl_can_use(tiny_model):
    from transformers import AutoTokenizer

    from hubgym.integrations.trl import tool_parsing_tokenizer

    tokenizer = tool_parsing_tokenizer(AutoTokenizer.from_pretrained(tiny_model))
    text = '<tool_call>\n{"name": "act", "arguments": {"action": "<guess>slate</guess>"}}\n</tool_call>'
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "play"}], add_generation_prompt=True)
    ids = tokenizer(text + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    parsed = tokenizer.parse_response(ids, prefix=prompt["input_ids"] if isinstance(prompt, dict) else prompt)
    assert parsed["tool_calls"][0]["function"] == {"name": "act", "arguments": {"action": "<guess>slate</guess>"}}
    assert from_trl_completion([parsed])[0]["tool_calls"][0]["arguments"] == '{"action": "<guess>slate</guess>"}'


@pytest.mark.slow
def test_a_template_that_writes_no_tool_calls_is_returned_as_it_is(smollm2_tokenizer):
    """SmolLM2's ChatML template has no tool calls: single_turn envs need no parser, so the README's wrapping of
    every tokenizer works with it (it raised TRL's 'Unrecognized chat template' before)."""
    from hubgym.integrations.trl import tool_parsing_tokenizer

    template = smollm2_tokenizer.chat_template
    assert tool_parsing_tokenizer(smollm2_tokenizer) is smollm2_tokenizer
    assert smollm2_tokenizer.chat_template == template and getattr(smollm2_tokenizer, "response_template", None) is None


def test_a_recorded_row_says_when_trl_kept_no_sampling_logprobs_and_keeps_the_row_contract():
    """What the recorder stores of a batch (trl_rows.batch_rows), built from TRL's own outputs: a row TRL's
    generation kept no logprobs for has none and says so (metric and provenance); every row keeps the row contract."""
    from hubgym.integrations.trl_rows import GenerationBatch, RunContext, batch_rows
    from hubgym.schemas.row_contract import row_breach

    env = trl_env("arithmetic:tiny", split="train", limit=1)
    row = dict(env.train_dataset[0])
    answer = json.loads(row[TASK_COLUMN])["info"]["answer"]
    completions = [[{"role": "assistant", "content": f"<answer>{answer}</answer>"}],
                   [{"role": "assistant", "content": "no idea"}]]
    batch = GenerationBatch(step=3, index=0, inputs=[row, row], prompts=[row["prompt"]] * 2, prompt_ids=[[5, 6]] * 2,
                            completion_ids=[[7, 8, 2], [9, 9]], tool_mask=None, completions=completions,
                            logprobs=[[-0.5, -0.25, -0.125], None],
                            scores=env.scorer.scores(completions, [row[TASK_COLUMN]] * 2, None), seconds=2.0)
    context = RunContext(run_id="trl-0123456789ab", env=env, model="m", sampling={"n": 2}, engine_version="trl 1.16.0",
                         stop_ids=frozenset({2}), tool_schemas=None)
    kept, missing = batch_rows(batch, context)
    assert [r["sample"] for r in (kept, missing)] == [0, 1] and kept["group"] == missing["group"]
    assert kept["rollout_id"] == f"trl-0123456789ab-s3g0-{kept['task_id']}-0"
    assert kept["provenance"]["policy_version"] == 3
    assert (kept["reward"], missing["reward"]) == (1.0, 0.0)
    assert (kept["finish_reason"], kept["truncated"], missing["finish_reason"], missing["truncated"]) == (
        "stop", False, "length", True)
    metrics = [{m["name"]: m["value"] for m in r["metrics"]} for r in (kept, missing)]
    assert [m["trl/sampling_logprobs"] for m in metrics] == [1.0, 0.0]
    assert missing["completion_logprobs"] == [] and missing["provenance"]["engine_version"].endswith(
        "no sampling logprobs")
    assert kept["completion_logprobs"] == [-0.5, -0.25, -0.125] and kept["completion_mask"] == [1, 1, 1]
    assert row_breach(kept) is None and row_breach(missing) is None
