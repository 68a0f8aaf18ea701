"""The calculator: exact arithmetic from a parsed tree; everything that is not arithmetic is refused
with a message the model can act on, and abuse (huge powers, long input) is refused cheaply."""

import json

import pytest

from hubgym.schemas import tool_call
from hubgym.tools import Toolbox, get_tool
from hubgym.tools.calculator import MAX_EXPRESSION_CHARS, calculator, evaluate, format_number


@pytest.mark.parametrize("expression, result", [
    ("2 + 3 * 4", "14"),
    ("(2 + 3) * 4", "20"),
    ("2 ** 3 ** 2", "512"),  # right-associative
    ("-2 ** 2", "-4"),  # ** binds tighter than unary minus
    ("(-2) ** 2", "4"),
    ("10 - 4 - 3", "3"),
    ("2 * 3 / 4", "1.5"),
    ("6 / 3", "2"),  # an integral float prints as an integer
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),
    ("-7 % 3", "2"),
    ("1 / 3", "0.333333333333"),  # 12 significant digits
    ("0.1 + 0.2", "0.3"),
    ("2 ** 0.5", "1.41421356237"),
    ("1.5e-7 * 2", "3e-07"),
    ("2 ** 100", "1267650600228229401496703205376"),  # integers stay exact
    ("12345678901234567890 * 10", "123456789012345678900"),
    ("1e15", "1e+15"),  # past 1e15 a float is not shown as an exact integer
    ("+-+3", "-3"),
    ("  1_000 + 1 ", "1001"),
    ("sqrt(16) + abs(-3)", "7"),
    ("round(2.567, 2)", "2.57"),
    ("round(7.5)", "8"),
    ("min(4, 2, 8) + max(1, 9)", "11"),
    ("log(8, 2)", "3"),
    ("log10(1000) + log2(8) + log(e)", "7"),
    ("floor(-2.5) + ceil(2.1)", "0"),
    ("factorial(10)", "3628800"),
    ("factorial(500) // factorial(499)", "500"),
    ("gcd(12, 18) + hypot(3, 4)", "11"),
    ("sin(pi / 2) + cos(0)", "2"),
    ("tau / pi", "2"),
])
def test_results(expression, result):
    assert calculator.fn(expression) == result


@pytest.mark.parametrize("expression, message", [
    ("x + 1", "unknown name 'x'; the constants are pi, e, tau"),
    ("__builtins__", "unknown name '__builtins__'; the constants are pi, e, tau"),
    ("math.pi", "attribute access (a.b) is not allowed: write sqrt(x), not math.sqrt(x)"),
    ("(1).__class__", "attribute access (a.b) is not allowed: write sqrt(x), not math.sqrt(x)"),
    ("__import__('os').system('true')", "function \"__import__('os').system\" is not allowed; the functions are "),
    ("__import__('os')", "function '__import__' is not allowed; the functions are abs, round, min, max, sqrt,"),
    ("open('/etc/passwd')", "function 'open' is not allowed"),
    ("eval('1')", "function 'eval' is not allowed"),
    ("'__import__(\"os\")'", "only numbers are allowed, not str '__import__(\"os\")'"),
    ("True + 1", "only numbers are allowed, not bool True"),
    ("1j", "only numbers are allowed, not complex 1j"),
    ("2 ^ 3", "'^' is not a power here: write 2**3"),
    ("1,000", "commas separate function arguments only: write 1000 rather than 1,000"),
    ("1 < 2", "comparisons are not supported: compute each side separately"),
    ("~1", "the operator Invert is not allowed"),
    ("1 << 9999", "the operator LShift is not allowed"),
    ("[1, 2]", "List is not allowed"),
    ("(lambda: 1)()", "function 'lambda: 1' is not allowed"),
    ("sqrt(x=4)", "sqrt() takes plain positional arguments only"),
    ("1 / 0", "division by zero"),
    ("5 // 0", "division by zero"),
    ("5 % 0.0", "division by zero"),
    ("sqrt(-1)", "sqrt(-1): math domain error"),
    ("log(0)", "log(0): math domain error"),
    ("factorial(2.5)", "factorial(2.5): 'float' object cannot be interpreted as an integer"),
    ("min()", "min(): min expected at least 1 argument, got 0"),
    ("(-8) ** (1 / 3)", "the result is not a real number"),
    ("2 ** 5000", "2 ** 5000 is too large (over 4096 bits)"),
    ("9 ** 9 ** 9", "9 ** 387420489 is too large (over 4096 bits)"),
    ("2 ** 4095 * 4", "the result is too large (over 4096 bits)"),
    ("10.0 ** 400", "the result is too large to compute"),
    ("exp(1000)", "the result is too large to compute"),
    ("1e400", "the result is too large or undefined (inf or nan)"),
    ("factorial(10 ** 6)", "factorial(1000000) is too large; the limit is factorial(500)"),
    ("1 +", "not a valid expression: invalid syntax"),
    ("", "not a valid expression"),
])
def test_refused_with_a_reason(expression, message):
    with pytest.raises(ValueError) as info:
        evaluate(expression)
    assert str(info.value).startswith(message), str(info.value)


def test_long_input_is_refused_before_parsing():
    with pytest.raises(ValueError, match=f"^expression is 1001 characters; the limit is {MAX_EXPRESSION_CHARS}"):
        evaluate("1+" * 500 + "1")
    assert evaluate("-" * 400 + "1") == 1  # deep but short nesting is fine


def test_format_number():
    assert [format_number(v) for v in (3, -0.0, 2.0, 1e16, 123.456, -1 / 7)] == [
        "3", "0", "2", "1e+16", "123.456", "-0.142857142857"]


def test_through_the_registry_and_toolbox():
    assert get_tool("calculator") is calculator
    box = Toolbox([calculator])
    ok = box.call(tool_call("c", "calculator", json.dumps({"expression": "(3 + 4) * 2"})))
    assert ok.message["content"] == "14" and ok.error is None
    bad = box.call(tool_call("c", "calculator", json.dumps({"expression": "os.system('ls')"})))
    assert bad.message["content"] == ("Error: ValueError: function 'os.system' is not allowed; the functions are abs, "
                                      "round, min, max, sqrt, exp, log, log2, log10, sin, cos, tan, asin, acos, atan, "
                                      "floor, ceil, factorial, gcd, hypot")
    detail = bad.message["content"].removeprefix("Error: ValueError: ")
    assert bad.error == {"boundary": "tool", "type": "ValueError", "message": detail}
    params = calculator.schema["function"]["parameters"]
    assert params["required"] == ["expression"] and params["properties"]["expression"]["type"] == "string"
