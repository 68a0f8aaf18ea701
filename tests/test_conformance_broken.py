"""The checker bites: each env in broken_envs/ has one fault, and fails the intended check with the intended message.

Messages are pinned whole; `{...}` stands for a part that changes from run to run (random
suffixes, sampled values) and `{id}` for a content-derived row id.
"""

import re
import shutil
from pathlib import Path

import pytest

from hubgym.conformance import assert_env_ok, check_env
from hubgym.errors import EnvContractError

ENVS = Path(__file__).parent / "broken_envs"
SEEDED_FIX = ("Fix: make it a function of its inputs only: derive randomness from the task (e.g. "
              "random.Random(task['info']['seed'])) and keep no module-level mutable state")
HIDDEN_STATE = ("most likely reset or step uses an unseeded random generator, the clock, or state kept outside "
                "`state` (a module-level variable that changes as it is called)")
CLOCKS = "2031-05-17 09:30:00 Pacific/Kiritimati, then 2003-02-03 22:15:00 America/Adak"
PURE_FIX = ("Fix: keep scoring pure: read shipped data at import time, keep caches in memory, and return values "
            "instead of writing them (stored rollouts are re-scored anywhere, forever)")

BROKEN = {
    "unstable_ids": (
        "check_ids_stable: ids differ between two builds of the same config and seed: row 0 was '{...}', then "
        "'{...}'; most likely the id or the content it hashes depends on a clock, a uuid or an unseeded random "
        "generator [env='unstable_ids' config='default' split='train' row='{...}' field='id']. Fix: draw everything "
        "from random.Random(seed) (the seed generate_tasks receives) and build rows with hubgym.make_task"),
    "nondeterministic_rows": (
        "check_deterministic_rows: row {...} differs between two builds of the same config and seed (info.word: "
        "'{...}' then '{...}'); most likely generate_tasks uses an unseeded random generator, the clock, or the order "
        "of a set [env='nondeterministic_rows' config='default' split='train' row='{id}' field='info.word']. Fix: "
        "draw everything from random.Random(seed) and iterate over sorted collections"),
    "reads_the_date": (
        "check_ids_stable: ids differ between two builds of the same config and seed: row 0 was '{id}', then '{id}' "
        "(its info.asked_on changed: '2031-05-17' then '2003-02-03'); the builds ran under two clocks and time zones "
        f"({CLOCKS}), and a third under the first clock gave the first build's rows again: generate_tasks reads the "
        "date, the clock or the time zone [env='reads_the_date' config='default' split='train' row='{id}' "
        "field='info.asked_on']. Fix: take dates from the config or from random.Random(seed), never from "
        "date.today(), datetime.now() or time.time(); run a wrapped generator that reads the clock under "
        "hubgym.builders.clock.at_clock(PINNED_CLOCK)"),
    "rows_follow_hash_seed": (
        "check_rows_independent_of_hash_seed: row {...} differs between builds in two processes with different hash "
        "seeds (PYTHONHASHSEED {...} here, {...} there) (info.word: '{...}' then '{...}'); most likely generate_tasks "
        "iterates over a set (or a dict built from one), or seeds a generator with hash() of a string "
        "[env='rows_follow_hash_seed' config='default' split='train' row='{id}' field='info.word']. Fix: iterate "
        "over sorted(...) collections, and derive seeds with hashlib or zlib.crc32, never hash()"),
    "reward_reads_the_clock": (
        f"check_scoring_deterministic: scoring the empty reply under two clocks and time zones ({CLOCKS}) gave "
        "reward 0.0 {'correct': 0.0, 'weekend': 1.0}, then reward 0.0 {'correct': 0.0, 'weekend': 0.0}, and under "
        "the first clock again reward 0.0 {'correct': 0.0, 'weekend': 1.0}: the verifier reads the date, the clock "
        "or the time zone [env='reward_reads_the_clock' config='default' split='train' row='{id}' "
        "field='verifier']. Fix: score from the task and the completion only; put any date a reward needs into the "
        "row's info when the builder makes it"),
    "reward_sometimes_wrong": (
        "check_scoring_deterministic: scoring {...} twice gave {...}, then {...}; most likely the verifier uses an "
        "unseeded random generator, the clock, or state kept between calls (it differed in {...} of {...} scorings "
        "of the same trajectory) [env='reward_sometimes_wrong' config='default' split='{...}' row='{id}' "
        f"field='verifier']. {SEEDED_FIX}"),
    "partial_credit_by_identity": (
        "check_scoring_deterministic: scoring {...} twice gave {...}, then {...}; most likely the verifier uses an "
        "unseeded random generator, the clock, or state kept between calls (it differed in {...} of {...} scorings "
        "of the same trajectory) [env='partial_credit_by_identity' config='default' split='{...}' row='{id}' "
        f"field='verifier']. {SEEDED_FIX}"),
    "batch_reward_reads_the_batch": (
        "check_batch_rows_independent: scoring a reply padded with spaces in a batch of 50 rows (all 50 rows in order) "
        "gave reward 0.0 {'correct': 0.0, 'length': 0.6857142857142857}, but alone it gave reward 0.0 {'correct': "
        "0.0, 'length': 1.0}; most likely batch reward 'length' computes a row's value from other rows of its batch "
        "(a mean, a maximum, a rank, a count, a cache by position): the rollout loop scores a group's samples as one "
        "batch and a re-score scores batches of other sizes and orders, so stored rewards would depend on the batch "
        "and a re-score would not reproduce them [env='batch_reward_reads_the_batch' config='default' split='train' "
        "row='{id}' field='length']. Fix: compute each row's value from its own task and completion only "
        "(vectorizing over the rows is fine; normalizing, ranking or caching across them is not)"),
    "reward_strips_in_place": (
        "check_scoring_leaves_its_inputs: scoring a reply padded with spaces changed the completion it was given "
        "([0].content went from '  <answer> 42 </answer>\\n' to '<answer> 42 </answer>'); the rollout loop scores "
        "all samples of a group with one task object, and a re-score builds each row's anew, so stored rewards would "
        "depend on the order samples finish and a re-score would not reproduce them [env='reward_strips_in_place' "
        "config='default' split='train' row='{id}' field='verifier']. Fix: copy what a reward needs to change (e.g. "
        "dict(task['info'])); never change the task or the messages it receives"),
    "tool_raises": (
        "check_tools_run: tool 'spell' (tools.py:spell) failed on every call the checker made with its golden cases' "
        "arguments (1): RuntimeError: the spelling service is down; a tool that always fails only ever hands the "
        "model an error [env='tool_raises' field='tools.py:spell']. Fix: fix the tool; raise only for arguments "
        "that are really wrong (the model gets the message), and give a golden case that calls it as a model should"),
    "tool_param_undocumented": (
        "check_tool_schemas: the schema of tool 'spell' (tools.py:spell) has no description for parameter 'sep'; "
        "most likely the docstring's Args section leaves it out, so the model is told nothing about it "
        "[env='tool_param_undocumented' field='tools.py:spell(sep)']. Fix: describe it in the docstring: `Args:` "
        "then `    sep: what it is, e.g. ...`"),
    "shaping_beyond_range": (
        "check_reward_range: the row's tool shaping can add 0.3 (spell: 3 calls x 0.1) to the 1.0 that golden case "
        "'spells, then answers' earns without shaping: a total of 1.3, above REWARD_RANGE (0.0, 1.1); rewards are "
        "never clamped, so a rollout making every shaped call would store a reward outside the declared range "
        "[env='shaping_beyond_range' config='default' split='train' row='{id}' field='interaction.tool_rewards']. "
        "Fix: declare REWARD_RANGE = (0.0, 1.3), or lower the shaping's max_calls or reward"),
    "observation_cache": (
        "check_reset_step_deterministic: running {...} on a fresh verifier after the other episodes, in the reverse "
        "order, gave different observations at step {...} ({...} in the first order, then {...}); most likely reset "
        "or step caches answers under a key that leaves out part of the task or state, so two tasks at one position "
        "get one answer [env='observation_cache' {...}]. Fix: key any cache on everything the answer depends on (the "
        "whole task info and state), or drop it"),
    "bad_feature": (
        "check_schema: the 'train' split declares 'interaction.max_turns' as Value('string'), but the task schema has "
        "Value('int32'); most likely the builder overrides _info [env='bad_feature' config='default' split='train' "
        "field='interaction.max_turns']. Fix: do not override _info: TaskBuilder declares "
        "hubgym.schemas.TASK_FEATURES; put extra data inside info"),
    "bad_prompt": (
        "check_builds: config 'default' failed to build: AttributeError: 'str' object has no attribute 'get'; the "
        "row's 'prompt' value does not fit the task schema [env='bad_prompt' config='default' split='train' "
        "row='{id}' field='prompt']. Fix: build rows with hubgym.make_task(...) and messages with "
        "hubgym.user()/assistant()/system(); put extra data inside info"),
    "unknown_tool": (
        "check_tool_schemas: tool 'no_such_tool' is neither the env's own nor in the tool registry (registry: {...}) "
        "[env='unknown_tool' field='TOOLS']. Fix: define it with @hubgym.tool in the env's tools.py and set "
        "TOOLS_MODULE = \"tools.py\" on the builder (it ships with the env); or fix the name; or install a package "
        "registering it in the 'hubgym.tools' entry-point group"),
    "golden_disagrees": (
        "check_golden_cases: golden case 'upper case counts' scored 0.0, but the golden file declares 1.0 "
        "(components {'correct': 0.0}); most likely the verifier changed what it rewards, or the case is wrong "
        "[env='golden_disagrees' field='GOLDEN']. Fix: fix the verifier; or, if the new reward is intended, update "
        "the case and bump ENV_VERSION"),
    "no_full_reward": (
        "check_golden_extremes: no golden case earns the top of REWARD_RANGE (1.0); declared rewards: [0.0] "
        "[env='no_full_reward' field='GOLDEN']. Fix: add a golden case whose trajectory earns full reward (1.0), so "
        "both ends of the range are tested"),
    "impure_write": (
        "check_verifier_pure: the verifier reached outside itself while scoring the empty reply: file write: open "
        "'/dev/null' mode 'w'; most likely it logs to a file, caches on disk or calls a service [env='impure_write' "
        f"config='default' split='train' row='{{id}}' field='verifier']. {PURE_FIX}"),
    "impure_socket": (
        "check_verifier_pure: the verifier reached outside itself while scoring the empty reply: network: "
        "socket.getaddrinfo '127.0.0.1' 9; most likely it logs to a file, caches on disk or calls a service "
        f"[env='impure_socket' config='default' split='train' row='{{id}}' field='verifier']. {PURE_FIX}"),
    "verifier_raises": (
        "check_scoring_no_errors: the verifier raised IndexError: list index out of range (at verifier.py:10 in "
        "correct) while scoring the empty reply; a verifier exception on well-formed input is a bug (the rollout is "
        "dropped from training) "
        "[env='verifier_raises' config='default' split='train' row='{id}' field='correct']. Fix: return a low "
        "reward for empty, off-format or wrong replies; raise only for a malformed task row"),
    "reward_out_of_range": (
        "check_reward_range: reward -1.0 for the empty reply is outside REWARD_RANGE (0.0, 1.0) (components "
        "{'correct': 0.0, 'penalty': -1.0}); most likely REWARD_RANGE leaves out a weighted reward, the step rewards "
        "or tool_rewards shaping [env='reward_out_of_range' config='default' split='train' row='{id}' "
        "field='REWARD_RANGE']. Fix: declare REWARD_RANGE = (low, high) bounding the total reward, or rescale the "
        "rewards into it"),
    "random_metric": (
        "check_scoring_deterministic: scoring the empty reply twice gave reward 0.0 {'correct': 0.0, 'confidence': "
        "{...}}, then reward 0.0 {'correct': 0.0, 'confidence': {...}}; most likely the verifier uses an unseeded "
        "random generator, the clock, or state kept between calls (it differed in {...} of {...} scorings of the "
        "same trajectory) [env='random_metric' config='default' "
        f"split='train' row='{{id}}' field='verifier']. {SEEDED_FIX}"),
    "nondeterministic_step": (
        "check_reset_step_deterministic: running golden case 'binary search finds it' again gave different "
        "observations at step 1 ('Lower. (hint #{...})' on a freshly imported verifier, then 'Lower. (hint #{...})' "
        f"after 74 other steps); {HIDDEN_STATE} [env='nondeterministic_step' field='GOLDEN']. {SEEDED_FIX}"),
    "hidden_step_counter": (
        "check_reset_step_deterministic: running golden case 'binary search finds it' again gave different states "
        "at step 1 ({'guesses': 1} on a freshly imported verifier, then {'guesses': 1, 'tired': True} after 74 other "
        f"steps); {HIDDEN_STATE} [env='hidden_step_counter' field='GOLDEN']. {SEEDED_FIX}"),
    "step_mutates_state": (
        "check_reset_step_deterministic: step 1 of golden case 'binary search finds it' changed the state it was "
        "given ({'guesses': 0} became {'guesses': 1}); the samples of a group all start from the one state reset "
        "returned, so one sample's step would change the others' episodes [env='step_mutates_state' "
        "field='GOLDEN']. Fix: return a new state from step (e.g. {**state, 'guesses': state['guesses'] + 1}); "
        "never change the one it receives"),
    "score_changes_task": (
        "check_scoring_leaves_its_inputs: scoring the empty reply changed the task it was given (info.answer was "
        "added (None)); the rollout loop scores all samples of a group with one task object, and a re-score builds "
        "each row's anew, so stored rewards would depend on the order samples finish and a re-score would not "
        "reproduce them [env='score_changes_task' config='default' split='train' row='{id}' field='verifier']. "
        "Fix: copy what a reward needs to change (e.g. dict(task['info'])); never change the task or the messages "
        "it receives"),
    "tool_use_without_tools": (
        "check_interaction: the row is tool_use but offers no tools [env='tool_use_without_tools' config='default' "
        "split='train' row='{id}' field='interaction.tools']. Fix: list its tools in hubgym.interaction('tool_use', "
        "tools=[...]), or make it single_turn"),
    "multi_turn_row_without_mdp": (
        "check_interaction: the row is multi_turn but verifier 'hubgym_user_verifier_{...}' has no reset/step "
        "[env='multi_turn_row_without_mdp' config='default' split='train' row='{id}' field='interaction.kind']. Fix: "
        "define reset and step in the verifier, or make the row single_turn"),
    "tool_not_in_catalog": (
        "check_interaction: the row offers tool 'calculator', which Echo.TOOLS does not list "
        "[env='tool_not_in_catalog' config='default' split='train' row='{id}' field='interaction.tools']. Fix: add "
        "'calculator' to TOOLS (the env catalog lists envs by tool)"),
    "shapes_unoffered_tool": (
        "check_interaction: tool_rewards shapes calls to 'python', which the row does not offer "
        "[env='shapes_unoffered_tool' config='default' split='train' row='{id}' field='interaction.tool_rewards']. "
        "Fix: only shape tools listed in interaction.tools"),
    "multi_turn_without_step": (
        "check_verifier_loads: KIND is 'multi_turn' but verifier 'hubgym_user_verifier_{...}' defines no reset/step "
        "[env='multi_turn_without_step' field='step']. Fix: define reset(task) -> (state, observation) and "
        "step(task, state, action) -> (state, observation, reward, done)"),
    "step_without_reset": (
        "check_verifier_loads: verifier 'hubgym_user_verifier_{...}' defines only one of reset/step "
        "[env='step_without_reset' field='reset']. Fix: a multi_turn verifier defines both reset(task) and "
        "step(task, state, action)"),
    "golden_without_interaction": (
        "check_golden_cases: golden case 'never finds it' (golden.jsonl:2) gives actions but has no "
        "task.interaction, so it would run as a single_turn task with max_turns 1 [env='golden_without_interaction' "
        "field='golden.jsonl:2 task.interaction']. Fix: add \"interaction\": {\"kind\": \"multi_turn\", "
        "\"max_turns\": N} to the case's task, with the env's max_turns"),
    "test_shares_train_tasks": (
        "check_held_out_apart: 5 of the 10 tasks of split 'test' are also in 'train' (row '{id}' has the prompt and "
        "info of train row '{id}'); a held-out split that shares tasks with the training split measures what the "
        "policy memorized, not what it learned [env='test_shares_train_tasks' config='default' split='test' "
        "row='{id}' field='info']. Fix: draw held-out tasks apart from train's: leave out what train holds, or "
        "assign each task to one split by a hash of its content (e.g. hashlib.sha256(key) % 5 == 0 goes to test)"),
    "reward_follows_hash_seed": (
        "check_scoring_independent_of_hash_seed: scoring {...} in a second process with another hash seed "
        "(PYTHONHASHSEED {...} here, {...} there) gave reward 0.0 {'correct': 0.0, 'bucket': {...}}, but here reward "
        "0.0 {'correct': 0.0, 'bucket': {...}}; most likely a reward or step uses hash() of a string (or follows the "
        "order of a set of strings), which Python seeds anew in every process [env='reward_follows_hash_seed' "
        "config='default' split='train' row='{id}' field='verifier']. Fix: derive numbers from text with hashlib or "
        "zlib.crc32, and iterate over sorted(...) collections; never hash() of a str or bytes"),
    "reward_reads_environment": (
        "check_scoring_independent_of_environment: scoring golden case 'repeats the word' gave reward 1.0 "
        "{'correct': 1.0}, then reward 0.0 {'correct': 1.0} once the environment variables the verifier reads were "
        "changed (ECHO_REWARD_WEIGHT: unset, then '0'); a reward or step that reads the environment gives another "
        "number in every process that scores it [env='reward_reads_environment' row='{id}' field='verifier']. Fix: "
        "put every setting a reward or step needs into the row's info (from the builder's config); never read "
        "os.environ in a verifier"),
    "reward_drifts_after_many_calls": (
        "check_scoring_stable_over_many_calls: scoring golden case 'repeats the word' gave reward 1.0 {'correct': "
        "1.0} on a freshly imported verifier, then reward 0.0 {'correct': 0.0} after 3,000 calls; most likely the "
        "verifier keeps state that changes as it is called (a call counter, a table or cache that grows and changes "
        "its answers once it is large), so a stored reward would depend on how long the process that scored it had "
        "run [env='reward_drifts_after_many_calls' row='{id}' field='verifier']. Fix: keep no module-level state "
        "that changes with calls; a cache must give what the function computes (functools.lru_cache of a pure "
        "function does)"),
    "reward_draws_global_random": (
        "check_scoring_leaves_global_random_alone: scoring the empty reply drew from the process's global random "
        "generator (random's state moved while the verifier ran); its result then depends on whatever else the "
        "process drew before, however rarely a draw changes it [env='reward_draws_global_random' config='default' "
        "split='train' row='{id}' field='verifier']. Fix: draw from a generator of the row's own "
        "(random.Random(task['info']['seed']), numpy.random.default_rng(seed)), never from the random module's "
        "functions or numpy.random's"),
}


def pin(template: str) -> str:
    """A regex matching the whole message: literal text, with {...} and {id} as the only wildcards."""
    parts = re.split(r"(\{\.\.\.\}|\{id\})", template)
    wild = {"{...}": ".+?", "{id}": r"[a-z_]+-[0-9a-f]{16}"}
    return "^" + "".join(wild.get(p, re.escape(p)) for p in parts) + "$"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_env_fails_the_intended_check_with_the_intended_message(name):
    intended = BROKEN[name].split(":", 1)[0]
    with pytest.raises(EnvContractError, match=pin(BROKEN[name])) as err:
        assert_env_ok(str(ENVS / name))
    assert err.value.check == intended and err.value.where.env == name


def test_every_broken_env_folder_is_pinned():
    folders = {p.name for p in ENVS.iterdir() if (p / "builder.py").is_file()}
    assert folders - {"baseline", "baseline_mdp"} == set(BROKEN)


@pytest.mark.slow
def test_check_env_reports_the_failure_without_raising_and_runs_the_other_checks():
    results = check_env(str(ENVS / "golden_disagrees"))
    failed = [r for r in results if not r.ok]
    assert [r.check for r in failed] == ["check_golden_cases"]
    assert re.match(pin(BROKEN["golden_disagrees"]), failed[0].message)
    assert results[-1].check == "check_golden_replay" and results[-1].ok  # later checks still ran


def test_a_check_that_cannot_run_is_reported_as_skipped_not_failed():
    """A row order that follows an unseeded generator also differs across processes: the hash-seed check is skipped
    (its prerequisite, two agreeing builds, failed), and the verdict counts one failure."""
    results = {r.check: r for r in check_env(str(ENVS / "nondeterministic_rows"))}
    skipped = results["check_rows_independent_of_hash_seed"]
    assert (skipped.status, skipped.failed) == ("skipped", False)
    assert skipped.message == (
        "check_rows_independent_of_hash_seed: skipped: needs two builds in this process that agree, which failed in "
        "check_deterministic_rows [env='nondeterministic_rows' config='default']. Fix: fix the "
        "check_deterministic_rows failure first")
    assert [r.check for r in results.values() if r.failed] == ["check_deterministic_rows"]


KEYED_ON = {  # faults keyed on something other than the clock that still give a reply one score, then another
    "object identity": "0.5 if id(completion) % 3 == 0 else 0.0",
    "a call counter (period 2)": "0.5 if next(CALLS) % 2 else 0.0",
    "a call counter (period 3)": "0.5 if next(CALLS) % 3 == 0 else 0.0",
}


@pytest.mark.parametrize("key", list(KEYED_ON))
def test_a_reward_keyed_on_identity_or_a_counter_is_not_blamed_on_the_clock(tmp_path, key):
    """The clock is blamed only when one object scored under the two clocks, in an order no counter follows, gets
    one score under each: identity and counters get the generic message, whatever the heap or the call count."""
    folder = Path(shutil.copytree(ENVS / "partial_credit_by_identity", tmp_path / "partial_credit_by_identity"))
    source = (folder / "verifier.py").read_text()
    fault = "0.5 if id(completion) % 3 == 0 else 0.0"
    assert fault in source
    source = source.replace(fault, KEYED_ON[key]).replace("\nREWARDS = ", "\nCALLS = itertools.count()\nREWARDS = ")
    (folder / "verifier.py").write_text(source.replace("\nfrom hubgym", "\nimport itertools\n\nfrom hubgym", 1))
    with pytest.raises(EnvContractError, match=pin(BROKEN["partial_credit_by_identity"])):
        assert_env_ok(str(folder))


@pytest.mark.slow
def test_a_batch_reward_drawn_at_random_fails_the_determinism_check_and_skips_the_batch_check(tmp_path):
    """Scores that change from call to call differ between batches too: that is check_scoring_deterministic's
    failure (and, drawn from the global generator, check_scoring_leaves_global_random_alone's), and the batch check
    says it could not tell (skipped), rather than blaming the batch."""
    folder = Path(shutil.copytree(ENVS / "batch_reward_reads_the_batch", tmp_path / "batch_reward_reads_the_batch"))
    source = (folder / "verifier.py").read_text()
    random_length = ("import random\n\n\ndef length(tasks, completions):\n"
                     "    return [random.random() for _ in completions]  # the fault: chance\n\n\n")
    (folder / "verifier.py").write_text(source.replace("BATCH_REWARDS = ", random_length + "BATCH_REWARDS = "))
    results = {r.check: r for r in check_env(str(folder))}
    assert [check for check, r in results.items() if r.failed] == ["check_scoring_deterministic",
                                                                   "check_scoring_leaves_global_random_alone"]
    assert results["check_batch_rows_independent"].status == "skipped"
    assert results["check_batch_rows_independent"].message.startswith(
        "check_batch_rows_independent: skipped: needs scores that repeat, which failed in check_scoring_deterministic")
