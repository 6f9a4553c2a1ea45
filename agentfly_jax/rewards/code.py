"""`code_pass_rate`: the fraction of a row's hidden unit tests a submitted function passes, run in
the bubblewrap `python_sandbox` env.

Row fields: `entry_point` (the function's name) and `tests` ([{"args": [...], "expected": ...}],
JSON values). The prediction is Python source (the last ```python block if it has fences). The
chain's sandbox is reset to a fresh interpreter first (so nothing the model ran earlier can
tamper with the check); the submission then runs in a child process that sees only the test
inputs (code_harness.py). An infinite loop, a crash, a fork bomb or a syntax error scores 0
(for the tests it did not answer) and never hangs the step: the child's process group is
killed after `timeout_s`.

  await run_hidden_tests(code, "add", [{"args": [1, 2], "expected": 3}], env=None)
  # -> {"reward": 1.0, "passed": 1, "total": 1, "error": None, "stderr": ""}
"""

from __future__ import annotations

import json
import pathlib
import re
import uuid

import trio

from agentfly_jax.rewards.reward import reward

_HARNESS = pathlib.Path(__file__).with_name("code_harness.py").read_text()
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S)


def extract_code(text: str) -> str:
  """The last fenced code block of `text`, or all of it when it has none."""
  blocks = _FENCE.findall(text or "")
  return blocks[-1] if blocks else (text or "")


def harness_source(code: str, entry_point: str, tests: list[dict], timeout_s: float, test_timeout_s: float) -> str:
  """The code sent to the sandbox: the settings as JSON, then code_harness.py."""
  settings = {
    "SUBMISSION": code,
    "ENTRY_POINT": entry_point,
    "ARGS": [list(t["args"]) for t in tests],
    "EXPECTED": [t["expected"] for t in tests],
    "TIMEOUT_S": timeout_s,
    "TEST_TIMEOUT_S": test_timeout_s,
  }
  header = f"import json as _json\nglobals().update(_json.loads({json.dumps(settings)!r}))\n"
  return header + _HARNESS


def _check_tests(entry_point, tests) -> None:
  if not isinstance(entry_point, str) or not entry_point.isidentifier():
    raise ValueError(f"code_pass_rate: row field 'entry_point' must be a function name, got {entry_point!r}")
  if not isinstance(tests, list) or not tests:
    raise ValueError("code_pass_rate: row field 'tests' must be a non-empty list")
  for i, t in enumerate(tests):
    if not isinstance(t, dict) or not isinstance(t.get("args"), list) or "expected" not in t:
      raise ValueError(f"code_pass_rate: tests[{i}] must be {{'args': [...], 'expected': ...}}, got {t!r:.80}")


async def run_hidden_tests(
  code: str, entry_point: str, tests: list[dict], env=None, timeout_s: float = 10.0, test_timeout_s: float = 2.0
) -> dict:
  """Runs the tests against `code` in `env` (a python_sandbox instance; None: a fresh one from
  the default env provider). Returns {"reward": passed / total, "passed", "total", "error",
  "stderr"}."""
  _check_tests(entry_point, tests)
  if env is None:
    from agentfly_jax.tools.tool import get_env_provider

    provider, chain = get_env_provider(), f"code-tests-{uuid.uuid4().hex[:12]}"
    env = await provider.acquire("python_sandbox", chain)
    try:
      return await run_hidden_tests(code, entry_point, tests, env, timeout_s, test_timeout_s)
    finally:
      with trio.CancelScope(shield=True):
        await provider.release("python_sandbox", chain)
  await env.reset(None)  # a fresh interpreter: earlier tool calls cannot have patched it
  source = harness_source(code, entry_point, tests, timeout_s, test_timeout_s)
  try:
    result = await env.step({"code": source, "timeout_s": timeout_s + 10.0})
  except Exception as e:  # noqa: BLE001 -- e.g. the sandbox was killed (memory): the score is 0
    return {
      "reward": 0.0,
      "passed": 0,
      "total": len(tests),
      "stderr": "",
      "error": f"the sandbox failed while testing: {type(e).__name__}: {e}",
    }
  observation = getattr(result, "observation", result)
  for line in reversed(str(observation).strip().splitlines()):
    try:
      report = json.loads(line)
    except ValueError:
      continue
    if isinstance(report, dict) and {"passed", "total"} <= set(report):
      return {"reward": report["passed"] / report["total"], **report}
  return {
    "reward": 0.0,
    "passed": 0,
    "total": len(tests),
    "error": "the test harness failed",
    "stderr": str(observation)[-2000:],
  }


@reward(env="python_sandbox")
async def code_pass_rate(prediction, entry_point, tests, env) -> dict:
  """Fraction of the hidden tests the submitted function passes (0 for no submission)."""
  if not prediction or not str(prediction).strip():
    return {"reward": 0.0, "passed": 0, "total": len(tests), "error": "no submission"}
  report = await run_hidden_tests(extract_code(str(prediction)), entry_point, tests, env)
  return {"reward": report["reward"], "passed": report["passed"], "total": report["total"]}
