"""The `calculator` tool: arithmetic on a parsed expression tree, never eval.

The expression is parsed with `ast` and walked node by node; only numbers, the operators
+ - * / // % ** (and unary + -), parentheses, the functions in FUNCTIONS and the constants in
CONSTANTS are accepted. Everything else (names, attributes, strings, subscripts, lambdas, calls
to anything else) is refused with a ValueError that says what is allowed, so the model can
retry. Size guards keep one call cheap: a length cap on the text, an integer size cap checked
before each power and after each operation, and float overflow reported as an error.
"""

# No `from __future__ import annotations`: the @tool decorator reads the hints as objects.

import ast
import math
import operator
from typing import Callable

from hubgym.tools.base import tool

MAX_EXPRESSION_CHARS = 500
MAX_INT_BITS = 4096  # ~1233 decimal digits: past this a power or product is refused before it is computed
MAX_ARGS = 100
MAX_FACTORIAL = 500  # 500! has ~3767 bits, within MAX_INT_BITS; larger arguments are refused before computing
INT_PRINT_LIMIT = 1e15  # integral floats below this print as integers ("6/3" -> "2"); above, floats are inexact

Number = int | float

BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
FUNCTIONS: dict[str, Callable[..., Number]] = {
    "abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "exp": math.exp, "log": math.log,
    "log2": math.log2, "log10": math.log10, "sin": math.sin, "cos": math.cos, "tan": math.tan, "asin": math.asin,
    "acos": math.acos, "atan": math.atan, "floor": math.floor, "ceil": math.ceil, "factorial": math.factorial,
    "gcd": math.gcd, "hypot": math.hypot,
}
CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}
HINTS: dict[type[ast.AST], str] = {  # the usual slips, with what to write instead
    ast.BitXor: "'^' is not a power here: write 2**3",
    ast.Tuple: "commas separate function arguments only: write 1000 rather than 1,000",
    ast.Compare: "comparisons are not supported: compute each side separately",
    ast.Attribute: "attribute access (a.b) is not allowed: write sqrt(x), not math.sqrt(x)",
}


@tool(timeout_s=5.0)
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression; integers are exact, decimals shown to 12 significant digits.

    Supports + - * / // % ** and parentheses, integers and decimals, the constants pi, e and tau,
    and the functions abs, round, min, max, sqrt, exp, log (log(x, base) too), log2, log10, sin,
    cos, tan, asin, acos, atan, floor, ceil, factorial, gcd and hypot.

    Args:
        expression: the expression to evaluate, e.g. "(3 + 4) * 2 ** 10 / sqrt(16)".
    """
    return format_number(evaluate(expression))


def evaluate(expression: str) -> Number:
    """The value of `expression`; ValueError (with a hint the model can act on) for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is {len(expression)} characters; the limit is {MAX_EXPRESSION_CHARS}. "
                         f"Split the computation into several calls")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        where = f" (at character {exc.offset})" if exc.offset else ""
        raise ValueError(f"not a valid expression: {exc.msg}{where}") from None
    except (ValueError, RecursionError, MemoryError) as exc:  # null bytes, absurd nesting
        raise ValueError(f"not a valid expression: {exc}") from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("the result is too large to compute") from None
    except RecursionError:
        raise ValueError("the expression is nested too deeply") from None
    return _checked(value)


def format_number(value: Number) -> str:
    """Integers (and integral floats of exact size) without '.0'; other floats to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < INT_PRINT_LIMIT:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if type(node.value) not in (int, float):  # bool is an int subclass: refused too
            raise ValueError(f"only numbers are allowed, not {type(node.value).__name__} {node.value!r}")
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in CONSTANTS:
            raise ValueError(f"unknown name {node.id!r}; the constants are {', '.join(CONSTANTS)}")
        return CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return _checked(UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _guard_power(left, right)
        return _checked(BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call):
        return _call(node)
    op = getattr(node, "op", None)
    hint = HINTS.get(type(op)) or HINTS.get(type(node))
    what = f"the operator {type(op).__name__}" if op is not None else type(node).__name__
    raise ValueError(hint or f"{what} is not allowed: use numbers, + - * / // % **, parentheses, "
                             f"and the functions {', '.join(FUNCTIONS)}")


def _call(node: ast.Call) -> Number:
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in FUNCTIONS:
        shown = name or ast.unparse(node.func)
        raise ValueError(f"function {shown!r} is not allowed; the functions are {', '.join(FUNCTIONS)}")
    if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
        raise ValueError(f"{name}() takes plain positional arguments only")
    if len(node.args) > MAX_ARGS:
        raise ValueError(f"{name}() got {len(node.args)} arguments; the limit is {MAX_ARGS}")
    args = [_eval(a) for a in node.args]
    if name == "factorial" and args and isinstance(args[0], int) and args[0] > MAX_FACTORIAL:
        raise ValueError(f"factorial({args[0]}) is too large; the limit is factorial({MAX_FACTORIAL})")
    try:
        return _checked(FUNCTIONS[name](*args))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}({', '.join(map(format_number, args))}): {exc}") from None


def _guard_power(base: Number, exponent: Number) -> None:
    """Refuse integer powers whose result would pass MAX_INT_BITS, before spending time on them."""
    if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and exponent > 0:
        if exponent * math.log2(abs(base)) > MAX_INT_BITS:
            raise ValueError(f"{format_number(base)} ** {exponent} is too large (over {MAX_INT_BITS} bits)")


def _checked(value: Number | complex) -> Number:
    """Every intermediate result stays a real, finite number of bounded size."""
    if isinstance(value, complex):
        raise ValueError("the result is not a real number (e.g. a fractional power of a negative number)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("the result is too large or undefined (inf or nan)")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ValueError(f"the result is too large (over {MAX_INT_BITS} bits)")
    return value
