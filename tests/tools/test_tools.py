"""@tool: schema from signature + docstring, sync/async, direct calls, truncation, errors as
observations, finish tools, stateful binding; the built-in calculator and code_interpreter."""

import ast
import random
import time
from typing import Literal, Optional

import pytest
import trio

from agentfly_jax import tool
from agentfly_jax.tools import (
  LocalEnvProvider,
  LocalMemoryEnv,
  Tool,
  answer,
  calculator,
  code_interpreter,
  evaluate_arithmetic,
  set_env_provider,
)


@tool
def get_weather(
  city: str,
  days: int = 1,
  unit: Literal["C", "F"] = "C",
  tags: Optional[list[str]] = None,
  ratio: float = 0.5,
  verbose: bool = False,
) -> str:
  """Weather forecast for a city.

  Looks the forecast up in a table.

  Args:
    city: the city name,
      possibly with a country.
    days (int): how many days ahead.
    unit: temperature unit.
    tags: labels.
    ratio: a fraction.
    verbose: more text.

  Returns:
    The forecast.
  """
  return f"{city}: sunny for {days} day(s) in {unit}"


@tool(name="fetch", description="Fetches a page.", max_length=20)
async def fetch_page(url: str) -> str:
  await trio.sleep(0)
  return "x" * 100 + url


def test_schema_from_signature_and_google_docstring():
  schema = get_weather.schema
  assert schema["type"] == "function"
  fn = schema["function"]
  assert fn["name"] == "get_weather"
  assert fn["description"] == "Weather forecast for a city.\n\nLooks the forecast up in a table."
  props = fn["parameters"]["properties"]
  assert props["city"] == {"type": "string", "description": "the city name, possibly with a country."}
  assert props["days"] == {"type": "integer", "description": "how many days ahead."}
  assert props["unit"] == {"type": "string", "enum": ["C", "F"], "description": "temperature unit."}
  assert props["tags"] == {"type": "array", "items": {"type": "string"}, "nullable": True, "description": "labels."}
  assert props["ratio"]["type"] == "number" and props["verbose"]["type"] == "boolean"
  assert fn["parameters"]["required"] == ["city"]
  assert fetch_page.name == "fetch" and fetch_page.schema["function"]["description"] == "Fetches a page."
  assert isinstance(get_weather, Tool) and "get_weather" in repr(get_weather)


def test_direct_calls_sync_and_awaited():
  assert get_weather(city="Oslo") == "Oslo: sunny for 1 day(s) in C"
  assert get_weather(city="Oslo", days=3, unit="F") == "Oslo: sunny for 3 day(s) in F"
  assert get_weather("Oslo", 2) == "Oslo: sunny for 2 day(s) in C"  # positional, like the function
  with pytest.raises(TypeError, match="6 positional argument"):
    get_weather("a", 1, "C", None, 0.5, False, "extra")

  async def main():
    return await get_weather.acall(city="Bergen"), await fetch_page.acall(url="u")

  weather, page = trio.run(main)
  assert weather == "Bergen: sunny for 1 day(s) in C"
  assert page.startswith("x" * 20) and "[truncated: 81 more characters]" in page

  async def awaited_call_inside_trio():
    return await get_weather(city="Oslo")  # inside trio a direct call is awaitable

  assert trio.run(awaited_call_inside_trio) == "Oslo: sunny for 1 day(s) in C"


@pytest.mark.parametrize(
  "arguments, message",
  [
    ({}, "missing required argument(s) 'city'"),
    ({"city": "Oslo", "country": "NO"}, "unknown argument(s) 'country'"),
    ({"city": 3}, "argument 'city' must be of type string"),
    ({"city": "Oslo", "days": "two"}, "argument 'days' must be of type integer"),
    ({"city": "Oslo", "days": True}, "argument 'days' must be of type integer"),
    ({"city": "Oslo", "unit": "K"}, "argument 'unit' must be of type string"),
    ({"city": "Oslo", "tags": [1]}, "argument 'tags' must be of type array"),
  ],
)
def test_bad_arguments_become_error_observations(arguments, message):
  out = trio.run(get_weather.run, arguments)
  assert not out.ok and out.observation.startswith("Error: ") and message in out.observation
  assert "get_weather" in out.observation


def test_accepted_argument_types():
  out = trio.run(get_weather.run, {"city": "Oslo", "ratio": 1, "tags": None})  # int for float
  assert out.ok
  out = trio.run(get_weather.run, ["Oslo"])
  assert not out.ok and "must be a JSON object" in out.observation


def test_exceptions_and_timeouts_become_error_observations():
  @tool
  def broken(x: int) -> str:
    """Always fails.

    Args:
      x: anything.
    """
    raise KeyError(f"no entry {x}")

  @tool(timeout_s=0.2)
  async def sleepy() -> str:
    """Sleeps too long."""
    await trio.sleep(5)
    return "never"

  assert broken(x=4) == "Error: tool 'broken' raised KeyError: 'no entry 4'"
  start = time.perf_counter()
  assert sleepy() == "Error: tool 'sleepy' timed out after 0.2 s"
  assert time.perf_counter() - start < 1.0


def test_non_string_outputs_and_truncation():
  @tool(max_length=10)
  def numbers(n: int) -> list:
    """Counts.

    Args:
      n: how many.
    """
    return list(range(n))

  assert numbers(n=3) == "[0, 1, 2]"
  long = numbers(n=30)
  assert long.startswith("[0, 1, 2, ") and long.endswith("more characters]")
  assert str(len("[" + ", ".join(map(str, range(30))) + "]") - 10) in long


def test_finish_tools():
  assert answer.is_finish and not calculator.is_finish
  out = trio.run(answer.run, {"answer": "42"})
  assert out.finished and out.ok and out.observation == "42"
  bad = trio.run(answer.run, {})
  assert not bad.finished and not bad.ok


def test_stateful_tool_needs_env_param_and_gets_a_fresh_env_when_called_directly():
  with pytest.raises(ValueError, match="parameter named 'env'"):
    tool(env="memory")(lambda key: key)

  @tool(env="memory")
  async def store(key: str, env) -> str:
    """Stores a key.

    Args:
      key: the key.
    """
    await env.step({"op": "set", "key": key, "value": 1})
    return f"{len(env.memory)} key(s)"

  assert "env" not in store.parameters["properties"]
  provider = LocalEnvProvider({"memory": LocalMemoryEnv})
  set_env_provider(provider)
  try:
    assert store(key="a") == "1 key(s)"
    assert store(key="b") == "1 key(s)"  # a fresh environment per direct call
    assert provider.num_created == 2 and provider.num_released == 2
  finally:
    set_env_provider(None)
  out = trio.run(store.run, {"key": "a"})
  assert not out.ok and "needs environment 'memory'" in out.observation


def test_calculator_matches_python_arithmetic_on_random_expressions():
  rng = random.Random(0)

  def expr(depth):
    if depth == 0 or rng.random() < 0.3:
      return str(rng.choice([rng.randint(0, 99), round(rng.uniform(0.1, 50), 3)]))
    op = rng.choice(["+", "-", "*", "/", "//", "%", "**"])
    right = expr(depth - 1) if op != "**" else str(rng.randint(0, 3))
    return f"({expr(depth - 1)} {op} {right})"

  checked = 0
  for _ in range(300):
    e = expr(4)
    try:
      expected = eval(compile(ast.parse(e, mode="eval"), "<ref>", "eval"), {"__builtins__": {}})
    except (ZeroDivisionError, OverflowError):
      assert calculator(expression=e).startswith("Error: ")
      continue
    if isinstance(expected, complex) or abs(expected) > 1e100:
      continue
    got = evaluate_arithmetic(e)
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-12), e
    checked += 1
  assert checked > 200
  assert calculator(expression="(2 + 3) * 4") == "20"
  assert calculator(expression="sqrt(16) + pi * 0") == "4"


@pytest.mark.parametrize(
  "expression",
  [
    "__import__('os').system('echo hi')",
    "open('/etc/passwd')",
    "x + 1",
    "(1).__class__",
    "[1, 2]",
    "9 ** 9 ** 9",
    "lambda: 1",
    "'a' * 3",
  ],
)
def test_calculator_rejects_everything_but_arithmetic(expression):
  assert calculator(expression=expression).startswith("Error: tool 'calculator' raised")


def test_code_interpreter_against_the_default_sandbox():
  envs = pytest.importorskip("agentfly_jax.envs")
  if not hasattr(envs, "default_provider"):
    pytest.skip("agentfly_jax.envs.default_provider is not available yet (env-server part)")
  try:
    out = code_interpreter(code="x = 6 * 7\nprint(x)")
  except Exception as e:  # no sandbox on this machine
    pytest.skip(f"the default env provider could not start: {e}")
  assert out.strip() == "42", out
