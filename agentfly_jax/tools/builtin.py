"""Built-in tools: `calculator` (safe arithmetic), `answer` (finish tool), `code_interpreter`
(Python in the chain's sandbox environment)."""

from __future__ import annotations

import ast
import math
import operator

from agentfly_jax.tools.tool import tool

_BINARY = {
  ast.Add: operator.add,
  ast.Sub: operator.sub,
  ast.Mult: operator.mul,
  ast.Div: operator.truediv,
  ast.FloorDiv: operator.floordiv,
  ast.Mod: operator.mod,
  ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {
  "sqrt": math.sqrt,
  "abs": abs,
  "round": round,
  "min": min,
  "max": max,
  "exp": math.exp,
  "log": math.log,
  "log10": math.log10,
  "sin": math.sin,
  "cos": math.cos,
  "tan": math.tan,
  "floor": math.floor,
  "ceil": math.ceil,
}
_CONSTANTS = {"pi": math.pi, "e": math.e}
_MAX_EXPONENT = 1000
_MAX_MAGNITUDE = 10**100


def evaluate_arithmetic(expression: str) -> int | float:
  """Evaluates an arithmetic expression by walking its AST (no `eval`).

  Supports numbers, + - * / // % **, parentheses, unary +/-, the constants pi and e and the
  functions sqrt abs round min max exp log log10 sin cos tan floor ceil.

  Raises:
    ValueError naming the unsupported element or a result out of range; ZeroDivisionError.
  """
  if not isinstance(expression, str) or not expression.strip():
    raise ValueError("expression must be a non-empty string")
  if len(expression) > 1000:
    raise ValueError(f"expression too long ({len(expression)} characters > 1000)")
  try:
    tree = ast.parse(expression.strip(), mode="eval")
  except SyntaxError as e:
    raise ValueError(f"not an arithmetic expression: {e.msg}") from None

  def visit(node):
    if isinstance(node, ast.Expression):
      return visit(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
      return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
      left, right = visit(node.left), visit(node.right)
      if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
        raise ValueError(f"exponent {right} too large (limit {_MAX_EXPONENT})")
      value = _BINARY[type(node.op)](left, right)
      if isinstance(value, complex):
        raise ValueError("result is a complex number")
      if isinstance(value, int) and abs(value) > _MAX_MAGNITUDE:
        raise ValueError("result too large")
      return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
      return _UNARY[type(node.op)](visit(node.operand))
    if isinstance(node, ast.Name) and node.id in _CONSTANTS:
      return _CONSTANTS[node.id]
    if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id in _FUNCTIONS
      and not node.keywords
    ):
      return _FUNCTIONS[node.func.id](*[visit(a) for a in node.args])
    raise ValueError(f"unsupported element {ast.unparse(node)!r} in expression")

  return visit(tree)


@tool
def calculator(expression: str) -> str:
  """Evaluates an arithmetic expression and returns the result.

  Args:
    expression: arithmetic with numbers, + - * / // % ** and parentheses, e.g. "(2 + 3) * 4".
  """
  value = evaluate_arithmetic(expression)
  if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
    value = int(value)
  return str(value)


@tool(finish=True)
def answer(answer: str) -> str:
  """Gives the final answer and ends the conversation.

  Args:
    answer: the final answer.
  """
  return answer


@tool(stateful=True, env="python_sandbox", max_length=2048)
async def code_interpreter(code: str, env) -> str:
  """Runs Python code in a sandbox and returns what it printed (stdout and stderr). State
  (variables, imports) persists between calls in one conversation.

  Args:
    code: the Python source to run.
  """
  result = await env.step(code)
  return result
