"""The `retail` env and tools: real builds, tool schemas, store rules, per-rollout state, replay scoring,
golden cases."""

import copy
import json
import random
import re

import pytest

import hubgym
from hubgym.envs import make_builder
from hubgym.builders.retail import Retail
from hubgym.errors import Where
from hubgym.schemas import Task, ToolCall, assistant, tool_call, validate_tasks
from hubgym.tools import Toolbox, get_tool, make_toolbox
from hubgym.tools.retail import RetailTools, apply, replay
from hubgym.verifiers import retail as rv

VERIFIER = Retail.verifier()
CASES = {c.name: c for c in Retail.golden_cases()}
CANCEL = CASES["looks up, then cancels the right order"].task  # mia_garcia_4821: #W1000001, #W1000003 pending


def _config(name):
    return next(c for c in Retail.BUILDER_CONFIGS if c.name == name)


@pytest.fixture(scope="module", params=Retail.config_names())
def built(request):
    return request.param, hubgym.build_tasks("retail", request.param)


class Agent:
    """Drives a real Toolbox the way the rollout loop does and records the completion."""

    def __init__(self, task: Task):
        self.task, self.box, self.completion, self.calls = task, make_toolbox(["retail"], task), [], 0

    def __call__(self, name: str, arguments) -> str:
        self.calls += 1
        call: ToolCall = tool_call(f"call_{self.calls}", name, arguments if isinstance(arguments, str)
                                   else json.dumps(arguments))
        outcome = self.box.call(call)
        self.completion += [assistant(None, [call]), outcome.message]
        return outcome.message["content"]

    def score(self) -> float:
        return VERIFIER.score(self.task, self.completion + [assistant("Done.")]).reward


def _solve(task: Task) -> Agent:
    """Look up, then act: the customer, each goal's order (and product, to exchange), then the write call."""
    agent = Agent(task)
    user_id = next(iter(task["info"]["db"]["users"]))
    orders = json.loads(agent("get_user", {"user_id": user_id}))["orders"]
    for goal in task["info"]["goals"]:
        assert goal["order_id"] in {o["order_id"] for o in orders}
        order = json.loads(agent("get_order", {"order_id": goal["order_id"]}))
        if goal["kind"] == "exchange":
            agent("get_product", {"product_id": order["items"][0]["product_id"]})
        assert not agent(goal["call"]["name"], goal["call"]["arguments"]).startswith("Error: ")
    return agent


@pytest.mark.slow
def test_builds_valid_rows(built):
    config, ds = built
    for split, rows in ds.items():
        validate_tasks(rows.data.table, Where("retail", config, split))
        assert len(set(rows["id"])) == len(rows) == _config(config).sizes[split]
        assert all(s == {"kind": "tool_use", "max_turns": _config(config).max_turns, "max_tokens": None,
                         "tools": ["retail"], "tool_rewards": []} for s in rows["interaction"])
        assert all(len(i["goals"]) == _config(config).goals for i in rows["info"])
        assert all(len({g["order_id"] for g in i["goals"]}) == len(i["goals"]) for i in rows["info"])
    kinds = {g["kind"] for i in ds["train"]["info"] for g in i["goals"]}
    assert kinds == {"cancel", "address", "return", "exchange"}


def test_rows_are_deterministic_per_seed():
    builder = make_builder("retail", "multi")
    first, second, other = (list(builder.generate_tasks("test", size=30, seed=s)) for s in (3, 3, 4))
    assert first == second and not {r["id"] for r in first} & {r["id"] for r in other}


@pytest.mark.slow
def test_requests_name_orders_by_their_items_only(built):
    _, ds = built
    for row in ds["test"]:
        text, db = row["prompt"][-1]["content"], row["info"]["db"]
        assert "#W" not in text and not re.search(r"\d{10}", text)  # ids must be looked up
        for goal in row["info"]["goals"]:
            named = [i["name"] for i in db["orders"][goal["order_id"]]["items"] if i["name"] in goal["request"]]
            others = [i["name"] for o, order in db["orders"].items() if o != goal["order_id"] for i in order["items"]]
            assert named and not set(named) & set(others)


def test_tool_schemas_are_openai_function_schemas():
    assert get_tool("retail") is RetailTools
    schemas = make_toolbox(["retail"], CANCEL).schemas()
    assert [s["function"]["name"] for s in schemas] == ["get_user", "get_order", "get_product", "cancel_order",
                                                       "update_address", "return_items", "exchange_items"]
    for schema in schemas:
        fn = schema["function"]
        assert schema["type"] == "function" and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", fn["name"]) and fn["description"]
        params = fn["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
        assert "$defs" not in json.dumps(params) and "$ref" not in json.dumps(params)
        for prop in params["properties"].values():
            assert prop["description"] and prop["type"] in ("string", "array")
            assert prop["type"] != "array" or prop["items"] == {"type": "string"}
    cancel = next(s for s in schemas if s["function"]["name"] == "cancel_order")["function"]["parameters"]
    assert cancel["properties"]["reason"]["enum"] == ["no longer needed", "ordered by mistake"]


@pytest.mark.slow
def test_looking_up_then_acting_earns_full_reward(built):
    for row in list(built[1]["test"])[:40]:
        agent = _solve(row)
        assert agent.score() == 1.0, row["prompt"][-1]["content"]
        assert VERIFIER.score(row, agent.completion).components["goals_done"] == 1.0


@pytest.mark.slow
def test_wrong_or_missing_actions_earn_nothing(built):
    """Nothing done earns 0; the right calls plus the same action on another order earn 0 when that action took."""
    outcomes = set()
    for row in list(built[1]["test"])[:60]:
        agent, info = Agent(row), row["info"]
        assert agent.score() == 0.0
        goals = info["goals"]
        others = [o for o in info["db"]["orders"] if o not in {g["order_id"] for g in goals}]
        if not others:  # every order of this customer is a goal order
            continue
        for g in goals:
            agent(g["call"]["name"], g["call"]["arguments"])
        assert agent.score() == 1.0
        answer = agent(goals[0]["call"]["name"], {**goals[0]["call"]["arguments"], "order_id": others[0]})
        took = not answer.startswith("Error: ")
        assert agent.score() == (0.0 if took else 1.0)
        outcomes.add(took)
    assert outcomes == {True, False}


def test_rule_violations_come_back_as_errors_and_change_nothing():
    agent = Agent(CANCEL)
    checks = [
        ("cancel_order", {"order_id": "#W1000002", "reason": "no longer needed"},
         "Error: ValueError: order #W1000002 is 'delivered'; only pending orders can be cancelled."),
        ("update_address", {"order_id": "#W1000002", "address1": "1 A St", "city": "X", "state": "TX", "zip": "1"},
         "Error: ValueError: order #W1000002 is 'delivered'; only pending orders can have their shipping address"),
        ("return_items", {"order_id": "#W1000001", "item_ids": ["1111111101"]},
         "Error: ValueError: order #W1000001 is 'pending'; only delivered orders can have items returned."),
        ("return_items", {"order_id": "#W1000002", "item_ids": ["1111111101"]},
         "Error: ValueError: items ['1111111101'] are not in order #W1000002; its items are"),
        ("exchange_items", {"order_id": "#W1000002", "item_ids": ["3333333301"], "new_item_ids": ["3333333302"]},
         "Error: ValueError: variant 3333333302 of Desk Lamp is out of stock"),
        ("exchange_items", {"order_id": "#W1000002", "item_ids": ["3333333301"], "new_item_ids": ["2222222202"]},
         "Error: ValueError: '2222222202' is not another variant of Desk Lamp"),
        ("get_order", {"order_id": "W1000001"}, "Error: ValueError: order 'W1000001' not found; order ids look like"),
        ("cancel_order", {"order_id": "#W1000001", "reason": "too expensive"}, "Error: InvalidArguments: reason:"),
        ("cancel_order", {"order_id": "#W1000001"}, "Error: InvalidArguments: reason: Field required"),
        ("cancel_order", '{"order_id": ', "Error: InvalidJSON: arguments are not valid JSON"),
        ("refund_order", {"order_id": "#W1000001"}, "Error: UnknownTool: no tool named 'refund_order'"),
    ]
    for name, arguments, prefix in checks:
        assert agent(name, arguments).startswith(prefix), name
    assert rv.final_db(CANCEL, agent.completion) == (CANCEL["info"]["db"], len(checks) - 1)  # unknown tools skipped
    assert agent.score() == 0.0


def test_rollouts_do_not_share_state_or_touch_the_task():
    pristine = copy.deepcopy(CANCEL)
    first, second = Agent(CANCEL), Agent(CANCEL)
    assert '"status": "cancelled"' in first("cancel_order", {"order_id": "#W1000001", "reason": "no longer needed"})
    assert json.loads(second("get_order", {"order_id": "#W1000001"}))["status"] == "pending"
    assert first("cancel_order", {"order_id": "#W1000001", "reason": "no longer needed"}).startswith("Error: ")
    assert CANCEL == pristine
    assert first.score() == 1.0 and second.score() == 0.0 and CANCEL == pristine


def test_results_do_not_alias_the_state():
    db = CANCEL["info"]["db"]
    new, order = apply(db, "get_order", {"order_id": "#W1000001"})
    order["status"] = "delivered"
    assert new["orders"]["#W1000001"]["status"] == "pending"
    after, _ = apply(db, "cancel_order", {"order_id": "#W1000001", "reason": "ordered by mistake"})
    assert after["orders"]["#W1000001"]["cancel_reason"] == "ordered by mistake"
    assert db["orders"]["#W1000001"]["status"] == "pending"


def test_the_order_items_are_listed_in_does_not_matter():
    db = CANCEL["info"]["db"]
    finals = [replay(db, [tool_call("a", "return_items", json.dumps({"order_id": "#W1000002", "item_ids": ids}))])[0]
              for ids in (["3333333301", "2222222201"], ["2222222201", "3333333301"])]
    assert finals[0] == finals[1] and finals[0]["orders"]["#W1000002"]["return_items"] == ["2222222201", "3333333301"]


def test_golden_cases_score_as_declared():
    assert {c.reward for c in CASES.values()} >= set(VERIFIER.reward_range)
    for case in CASES.values():
        assert VERIFIER.score(case.task, case.completion).reward == case.reward, case.name
    partial = CASES["multi: only the address change"]
    assert VERIFIER.score(partial.task, partial.completion).components["goals_done"] == 0.5


def _random_call(rng: random.Random, db: dict) -> tuple[str, str]:
    """A call that is mostly well-formed and aimed at real ids, so both successes and broken rules occur."""
    order_id = rng.choice([*db["orders"]] * 9 + ["#W0000000"])
    items = db["orders"].get(order_id, {"items": [{"item_id": "0", "product_id": "0"}]})["items"]
    picked = rng.sample(items, rng.randint(1, len(items)))
    variants = [rng.choice([*db["products"].get(i["product_id"], {"variants": ["0"]})["variants"]]) for i in picked]
    name, arguments = rng.choice([
        ("get_order", {"order_id": order_id}),
        ("cancel_order", {"order_id": order_id, "reason": rng.choice(["no longer needed", "ordered by mistake", "x"])}),
        ("update_address", {"order_id": order_id, "address1": " 1 Main St ", "city": "Reno", "state": "NV",
                            "zip": rng.choice(["89501", "89501", 89501])}),
        ("return_items", {"order_id": order_id, "item_ids": [i["item_id"] for i in picked]}),
        ("exchange_items", {"order_id": order_id, "item_ids": [i["item_id"] for i in picked],
                            "new_item_ids": variants}),
    ])
    return name, json.dumps(arguments) if rng.random() < 0.95 else "{not json"


@pytest.mark.slow
def test_replay_reproduces_the_rollout_state(built):
    """Random calls (many breaking rules) through a live ToolSet and through the verifier's replay agree."""
    rng = random.Random(7)
    for row in list(built[1]["train"])[:60]:
        tools = RetailTools(row)
        box, completion = Toolbox(tools.bound_tools()), []
        for n in range(12):
            call = tool_call(str(n), *_random_call(rng, tools.db))
            completion += [assistant(None, [call]), box.call(call).message]
        failed = sum(m["content"].startswith("Error: ") for m in completion if m["role"] == "tool")
        assert replay(row["info"]["db"], rv.tool_calls(completion)) == (tools.db, failed)
        assert VERIFIER.score(row, completion).reward == float(rv.final_db(row, completion)[0] == rv.expected_db(row))
