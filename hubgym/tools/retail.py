"""Retail: a tiny store database and the tools a customer-service agent serves it with (tau-bench style).

The database is JSON, held in a task's `info["db"]` (the initial state of that task):

    users:    {user_id: {"user_id", "name", "email", "address", "orders": [order_id, ...]}}
    orders:   {order_id: {"order_id", "user_id", "status", "address",
                          "items": [{"item_id", "product_id", "name", "options", "price"}]}}
    products: {product_id: {"product_id", "name", "variants": {item_id: {"options", "price", "available"}}}}

An address is {"address1", "address2", "city", "state", "zip"}. Order statuses are "pending",
"processed", "delivered", "cancelled", "return requested" and "exchange requested".

Rules (as in tau-bench's retail domain): only pending orders can be cancelled (with a reason
from REASONS) or get a new shipping address; only delivered orders can have items returned,
or exchanged for another available variant of the same product. A broken rule raises
ValueError with what to do instead.

Every call goes through the pure `apply(db, name, arguments) -> (db, result)`, which runs the
tool on a copy (a failed call leaves the state as it was). `RetailTools` (one per rollout) and
`replay` (what the verifier runs over a stored completion) both use it, so re-scoring a rollout
reproduces its final database exactly, without running anything.
"""

import dataclasses
import functools
import json
from typing import Any, Iterable, Literal, get_args

from hubgym.schemas.messages import ToolCall
from hubgym.schemas.tasks import Task
from hubgym.tools.base import Tool, ToolSet, tool

# No `from __future__ import annotations` here: the @tool decorator reads the hints as objects.
Db = dict[str, Any]
Reason = Literal["no longer needed", "ordered by mistake"]
REASONS: tuple[str, ...] = get_args(Reason)


def apply(db: Db, name: str, arguments: dict[str, Any]) -> tuple[Db, Any]:
    """Run tool `name` on a copy of `db`; returns (new db, result). Raises ValueError on a broken rule."""
    tools = {t.name: t for t in RetailTools.tools()}
    if name not in tools:
        raise ValueError(f"no retail tool named {name!r}; tools: {sorted(tools)}")
    state = RetailTools({"info": {"db": db}})  # type: ignore[arg-type]  # a bare db: no task row needed
    result = tools[name].fn(state, **arguments)
    return state.db, _copy(result)  # the result must not alias the state the next call changes


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))  # a deep copy of JSON data, several times faster than copy.deepcopy


def replay(db: Db, calls: Iterable[ToolCall]) -> tuple[Db, int]:
    """Apply stored tool calls in order, as a rollout ran them; returns (final db, failed retail calls).

    Arguments are validated by the same models the Toolbox uses, so a call that failed at rollout
    time (bad JSON, bad arguments, a broken rule) fails here too and changes nothing. Calls to
    other tools are skipped.
    """
    models = {t.name: t.arguments for t in RetailTools.tools()}
    failed = 0
    for call in calls:
        if call["name"] not in models:
            continue
        try:  # json and pydantic errors are ValueErrors too
            arguments = models[call["name"]].model_validate(json.loads(call["arguments"] or "{}"))
            db, _ = apply(db, call["name"], dict(arguments))
        except ValueError:
            failed += 1
    return db, failed


class RetailTools(ToolSet):
    """The retail tools over one rollout's private copy of the task's database.

    The @tool methods are the state transitions (they change `self.db` in place); the Toolbox
    reaches them only through `apply`, which runs each on a copy and keeps it on success.
    """

    NAME = "retail"

    def __init__(self, task: Task) -> None:
        super().__init__(task)
        self.db: Db = _copy(task["info"]["db"])  # rollouts never share (or write back) state

    def bound_tools(self) -> list[Tool]:
        """Every call runs through `apply`, so one that breaks a rule leaves `self.db` as it was."""
        return [dataclasses.replace(t, fn=functools.partial(self._run, t.name)) for t in self.tools()]

    def _run(self, name: str, **arguments: Any) -> Any:
        self.db, result = apply(self.db, name, arguments)
        return result

    # -- lookups that explain what went wrong ----------------------------------------------------

    def _user(self, user_id: str) -> dict:
        if user_id not in self.db["users"]:
            raise ValueError(f"user {user_id!r} not found; use the user id exactly as the customer gave it")
        return self.db["users"][user_id]

    def _order(self, order_id: str, status: str | None = None, action: str = "") -> dict:
        if order_id not in self.db["orders"]:
            raise ValueError(f"order {order_id!r} not found; order ids look like '#W1234567' "
                             f"(get_user lists a customer's orders)")
        order = self.db["orders"][order_id]
        if status is not None and order["status"] != status:
            raise ValueError(f"order {order_id} is {order['status']!r}; only {status} orders can {action}. "
                             f"Tell the customer it cannot be done")
        return order

    def _product(self, product_id: str) -> dict:
        if product_id not in self.db["products"]:
            raise ValueError(f"product {product_id!r} not found; take product ids from the order's items (get_order)")
        return self.db["products"][product_id]

    @staticmethod
    def _items(order: dict, item_ids: list[str]) -> list[dict]:
        """The order's items named by `item_ids` (each once, at least one)."""
        owned = {i["item_id"]: i for i in order["items"]}
        if not item_ids or len(set(item_ids)) != len(item_ids):
            raise ValueError("item_ids must list each item id once, and at least one")
        missing = [i for i in item_ids if i not in owned]
        if missing:
            raise ValueError(f"items {missing} are not in order {order['order_id']}; its items are {sorted(owned)}")
        return [owned[i] for i in item_ids]

    # -- the tools -------------------------------------------------------------------------------

    @tool
    def get_user(self, user_id: str) -> dict:
        """Look up a customer: name, email, default address, and each order's id, status and item names.

        Args:
            user_id: the customer's user id, e.g. "mia_garcia_4821".
        """
        orders = [{"order_id": o, "status": self.db["orders"][o]["status"],
                   "items": [i["name"] for i in self.db["orders"][o]["items"]]} for o in self._user(user_id)["orders"]]
        return {**self._user(user_id), "orders": orders}

    @tool
    def get_order(self, order_id: str) -> dict:
        """Get an order's details: status, shipping address, and items with item and product ids.

        Args:
            order_id: e.g. "#W1234567" (with the leading '#').
        """
        return self._order(order_id)

    @tool
    def get_product(self, product_id: str) -> dict:
        """Get a product's variants: item id, options, price and availability of each.

        Args:
            product_id: the product id of an order item.
        """
        return self._product(product_id)

    @tool
    def cancel_order(self, order_id: str, reason: Reason) -> dict:
        """Cancel a pending order (other statuses cannot be cancelled).

        Args:
            order_id: the order to cancel.
            reason: why the customer cancels.
        """
        order = self._order(order_id, "pending", "be cancelled")
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {list(REASONS)}, not {reason!r}")
        order.update(status="cancelled", cancel_reason=reason)
        return order

    @tool
    def update_address(self, order_id: str, address1: str, city: str, state: str, zip: str,
                       address2: str = "") -> dict:
        """Change the shipping address of a pending order.

        Args:
            order_id: the order to change.
            address1: street and number, e.g. "12 Oak Street".
            city: city name.
            state: two-letter state code.
            zip: five-digit zip code, as a string.
            address2: apartment or suite; "" when there is none.
        """
        order = self._order(order_id, "pending", "have their shipping address changed")
        fields = {"address1": address1, "address2": address2, "city": city, "state": state, "zip": zip}
        order["address"] = {k: v.strip() for k, v in fields.items()}
        return order

    @tool
    def return_items(self, order_id: str, item_ids: list[str]) -> dict:
        """Request a return of some items of a delivered order.

        Args:
            order_id: the delivered order.
            item_ids: item ids (from get_order) of the items to return.
        """
        order = self._order(order_id, "delivered", "have items returned")
        self._items(order, item_ids)
        order.update(status="return requested", return_items=sorted(item_ids))
        return order

    @tool
    def exchange_items(self, order_id: str, item_ids: list[str], new_item_ids: list[str]) -> dict:
        """Exchange items of a delivered order for other available variants of the same products.

        Args:
            order_id: the delivered order.
            item_ids: item ids (from get_order) of the items to exchange.
            new_item_ids: for each item, in the same order, the item id of the new variant (from get_product).
        """
        order = self._order(order_id, "delivered", "have items exchanged")
        if len(new_item_ids) != len(item_ids):
            raise ValueError(f"give one new item id per exchanged item ({len(item_ids)}), not {len(new_item_ids)}")
        for item, new_id in zip(self._items(order, item_ids), new_item_ids):
            variants = self._product(item["product_id"])["variants"]
            if new_id not in variants or new_id == item["item_id"]:
                raise ValueError(f"{new_id!r} is not another variant of {item['name']} (item {item['item_id']}); "
                                 f"pick one from get_product({item['product_id']!r})")
            if not variants[new_id]["available"]:
                raise ValueError(f"variant {new_id} of {item['name']} is out of stock; offer an available variant")
        # stored as a mapping: the same exchange however the model ordered the pairs
        order.update(status="exchange requested", exchange=dict(sorted(zip(item_ids, new_item_ids))))
        return order
