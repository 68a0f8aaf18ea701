"""Retail: serve a store customer's requests with database tools (tau-bench style).

Task:
    A customer asks, in one message, to cancel a pending order, change its shipping address,
    return items of a delivered order, or exchange an item for another variant. Orders are
    named by what is in them, so the agent looks up the customer, the order (and, to exchange,
    the product) before it acts with the `retail` tools (hubgym.tools.retail). Each task has its
    own database: one customer with 2-3 orders in various states, from `data/retail_catalog.json`.
Row schema:
    info = {"db": the initial database, "goals": [{"kind", "order_id", "request", "call":
    {"name", "arguments"}}], "expected_changes": {table: {key: record}}, the records the goals
    rewrite as they must end}; interaction tool_use, tools ["retail"], max_turns 8 (multi: 12).
    `goals[].call` is a reference write call, for inspection and demonstrations (not scored).
Reward:
    db_match (weight 1): replaying the completion's tool calls on info.db yields info.db with
    info.expected_changes put in place -- every asked change and nothing else. Metrics
    (weight 0): goals_done (fraction of goal orders as expected), failed_calls. Total in [0, 1].
Arguments:
    configs default (one request) and multi (two requests, on two orders);
    RetailConfig.goals, .max_turns, TaskConfig.seed and .sizes.
Version history:
    v1: first release.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from hubgym.builders.base import TaskBuilder, TaskConfig, distinct
from hubgym.schemas import Task, interaction, make_task, system, user
from hubgym.tools.retail import REASONS, apply

CATALOG: dict[str, Any] = json.loads((Path(__file__).parent / "data" / "retail_catalog.json").read_text())
NEEDS = {"cancel": "pending", "address": "pending", "return": "delivered", "exchange": "delivered"}  # status per kind
STATUSES = ("pending", "processed", "delivered", "cancelled")  # of orders no request is about
REASON_TEXT = {"no longer needed": "I no longer need it", "ordered by mistake": "I ordered it by mistake"}
SYSTEM = ("You are a customer service agent for an online store. Help the customer with the tools: look things up "
          "before you act, and change only what the customer asks for. Store policy: only pending orders can be "
          f"cancelled (reason {' or '.join(map(repr, REASONS))}) or have their shipping address changed; only "
          "delivered orders can have items returned or exchanged, and an exchange must be for an available variant "
          "of the same product. Do not act on a request the policy forbids; explain why instead. When you are done, "
          "reply with a short summary.")


@dataclass
class RetailConfig(TaskConfig):
    goals: int = 1  # requests per task, each on its own order
    max_turns: int = 8  # assistant turns: lookups and actions, plus the final reply


class Retail(TaskBuilder):
    __doc__ = __doc__
    ENV = "retail"
    KIND = "tool_use"
    TOOLS = ("retail",)
    TAGS = ("tools", "agent", "customer_service")
    VERIFIER = "hubgym.verifiers.retail"
    GOLDEN = "golden/retail.jsonl"
    BUILDER_CONFIG_CLASS = RetailConfig
    BUILDER_CONFIGS = [
        RetailConfig(name="default", goals=1, max_turns=8, sizes={"train": 1000, "test": 100}),
        RetailConfig(name="multi", goals=2, max_turns=12, sizes={"train": 1000, "test": 100}),
    ]

    def generate_tasks(self, split: str, size: int, seed: int) -> Iterator[Task]:
        rng = random.Random(seed)
        spec = interaction("tool_use", max_turns=self.config.max_turns, tools=self.TOOLS)

        def draw() -> Task:
            prompt, info = _draw_task(rng, self.config.goals)
            return make_task(self.ENV, prompt, info, spec, difficulty=self.config.name,
                             tags=[g["kind"] for g in info["goals"]])
        yield from distinct(draw, size, key=lambda row: row["id"])  # no task twice; ends if the space is spent


def _draw_task(rng: random.Random, goals: int) -> tuple[list, dict[str, Any]]:
    """A database, `goals` requests on distinct orders, and the database once they are done."""
    kinds = [rng.choice(list(NEEDS)) for _ in range(goals)]
    statuses = [NEEDS[k] for k in kinds] + [rng.choice(STATUSES) for _ in range(max(0, rng.randint(2, 3) - goals))]
    db, user_id = _database(rng, statuses)
    drawn = [_goal(rng, db, kind, order_id) for kind, order_id in zip(kinds, db["users"][user_id]["orders"])]
    rng.shuffle(db["users"][user_id]["orders"])  # the goal orders are not always listed first
    final = db
    for goal in drawn:
        final, _ = apply(final, goal["call"]["name"], goal["call"]["arguments"])
    changes = {table: {key: record for key, record in final[table].items() if db[table].get(key) != record}
               for table in final}  # {table: {key: record}}: only what the goals change, not a second db
    text = f"Hi, I'm {db['users'][user_id]['name']} (user id {user_id}). " + " ".join(g["request"] for g in drawn)
    return [system(SYSTEM), user(text)], {"db": db, "goals": drawn,
                                          "expected_changes": {t: c for t, c in changes.items() if c}}


def _database(rng: random.Random, statuses: list[str]) -> tuple[dict[str, Any], str]:
    """One customer with one order per status (in order); no product is in two orders, so naming it names the order."""
    first, last = rng.choice(CATALOG["first_names"]), rng.choice(CATALOG["last_names"])
    user_id = f"{first}_{last}_{rng.randint(1000, 9999)}".lower()
    sizes = [rng.randint(1, 3) for _ in statuses]
    specs = iter(rng.sample(CATALOG["products"], sum(sizes)))
    db: dict[str, Any] = {"users": {}, "orders": {}, "products": {}}
    for status, size, number in zip(statuses, sizes, rng.sample(range(1_000_000, 10_000_000), len(statuses))):
        items = []
        for spec in itertools.islice(specs, size):
            product = _product(rng, spec)
            db["products"][product["product_id"]] = product
            item_id = rng.choice(sorted(product["variants"]))
            items.append({"item_id": item_id, "product_id": product["product_id"], "name": spec["name"],
                          **{k: product["variants"][item_id][k] for k in ("options", "price")}})
        order_id = f"#W{number}"
        db["orders"][order_id] = {"order_id": order_id, "user_id": user_id, "status": status,
                                  "address": _address(rng), "items": items}
    db["users"][user_id] = {"user_id": user_id, "name": f"{first} {last}", "address": _address(rng),
                            "email": f"{first}.{last}{rng.randint(10, 99)}@example.com".lower(),
                            "orders": list(db["orders"])}
    return db, user_id


def _product(rng: random.Random, spec: dict[str, Any]) -> dict[str, Any]:
    """A catalog product with one variant per combination of options, priced within 10% of its base price."""
    variants = {str(rng.randint(10**9, 10**10 - 1)): {"options": dict(zip(spec["options"], combo)),
                                                     "available": rng.random() < 0.7,
                                                     "price": round(spec["price"] * rng.uniform(0.9, 1.1), 2)}
                for combo in itertools.product(*spec["options"].values())}
    return {"product_id": str(rng.randint(10**9, 10**10 - 1)), "name": spec["name"], "variants": variants}


def _address(rng: random.Random) -> dict[str, str]:
    city, state, zip_code = rng.choice(CATALOG["cities"])
    address2 = rng.choice(["", f"Apt {rng.randint(1, 40)}", f"Suite {rng.randint(100, 900)}"])
    return {"address1": f"{rng.randint(1, 999)} {rng.choice(CATALOG['streets'])}", "address2": address2,
            "city": city, "state": state, "zip": zip_code}


def _goal(rng: random.Random, db: dict[str, Any], kind: str, order_id: str) -> dict[str, Any]:
    """A request on `order_id`, worded by the order's items, with the write call that fulfils it."""
    order = db["orders"][order_id]
    item = rng.choice(order["items"])
    if kind == "cancel":
        reason = rng.choice(REASONS)
        request = f"Please cancel my order with the {item['name']}: {REASON_TEXT[reason]}."
        call = {"name": "cancel_order", "arguments": {"order_id": order_id, "reason": reason}}
    elif kind == "address":
        new = _address(rng)
        while new == order["address"]:
            new = _address(rng)
        where = ", ".join(v for v in (new["address1"], new["address2"], new["city"]) if v)
        request = f"Please ship my order with the {item['name']} to {where}, {new['state']} {new['zip']} instead."
        call = {"name": "update_address", "arguments": {"order_id": order_id, **new}}
    elif kind == "return":
        items = rng.sample(order["items"], rng.randint(1, len(order["items"])))
        names = [f"the {i['name']} ({_options(i['options'])})" for i in items]
        request = f"I'd like to return {' and '.join(filter(None, [', '.join(names[:-1]), names[-1]]))} I received."
        call = {"name": "return_items", "arguments": {"order_id": order_id, "item_ids": [i["item_id"] for i in items]}}
    else:
        variants = db["products"][item["product_id"]]["variants"]
        new_id = rng.choice(sorted(v for v in variants if v != item["item_id"]))
        variants[new_id]["available"] = True  # a request the store can fulfil
        request = (f"I received the {item['name']} ({_options(item['options'])}); I'd like to exchange it for the "
                   f"one with {_options(variants[new_id]['options'])}.")
        call = {"name": "exchange_items",
                "arguments": {"order_id": order_id, "item_ids": [item["item_id"]], "new_item_ids": [new_id]}}
    return {"kind": kind, "order_id": order_id, "request": request, "call": call}


def _options(options: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())
