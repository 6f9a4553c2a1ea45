"""The math task: generated problems whose answers need computation (use the code interpreter).

Kinds: big products, modular exponentiation, combinatorics (binomials, multiset permutations),
date arithmetic (days between dates), unit arithmetic (speed x time in metres, volumes) and
small word problems (shopping change, work rates). Rows: {"question", "answer" (a string),
"kind"}; reward `math_equal` (equivalent forms count). Train/test split by the question text's
hash (1 in 5 to test), so no test question is ever a training question.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import random

from agentfly_jax.rewards.math import math_equal
from agentfly_jax.tools.builtin import answer, code_interpreter

SYSTEM_PROMPT = (
  "Solve the problem. Use the code interpreter for any calculation, then call answer with the final number only."
)
TOOLS = (code_interpreter, answer)
REWARD = math_equal
NAMES = ("Ana", "Bo", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hana", "Ines", "Jun")
ITEMS = (("pens", "notebooks"), ("apples", "melons"), ("stamps", "envelopes"), ("bolts", "gears"))


def _product(rng):
  a, b = rng.randint(10**4, 10**7), rng.randint(10**4, 10**7)
  return f"What is {a:,} multiplied by {b:,}?", a * b


def _modpow(rng):
  base, exp, mod = rng.randint(2, 99), rng.randint(100, 10**6), rng.choice((97, 1000, 1009, 10**4 + 7))
  return f"What is the remainder when {base}^{exp} is divided by {mod}?", pow(base, exp, mod)


def _binomial(rng):
  n = rng.randint(12, 60)
  k = rng.randint(2, n // 2)
  return f"In how many ways can a committee of {k} be chosen from {n} people?", math.comb(n, k)


def _arrangements(rng):
  word = "".join(rng.choice("ABCDE") for _ in range(rng.randint(6, 11)))
  counts = [word.count(c) for c in set(word)]
  value = math.factorial(len(word))
  for c in counts:
    value //= math.factorial(c)
  return f"How many distinct arrangements of the letters of {word} are there?", value


def _days_between(rng):
  start = datetime.date(1900, 1, 1) + datetime.timedelta(days=rng.randint(0, 45000))
  end = start + datetime.timedelta(days=rng.randint(30, 20000))
  return (f"How many days are there from {start:%d %B %Y} to {end:%d %B %Y}?", (end - start).days)


def _distance(rng):
  speed, hours, minutes = rng.randint(20, 130), rng.randint(0, 9), rng.randrange(3, 60, 3)
  return (
    f"A train travels at {speed} km/h for {hours} h {minutes} min. How many metres does it travel?",
    speed * (1000 * hours + 50 * minutes // 3),
  )


def _volume(rng):
  a, b, c = rng.randint(12, 480), rng.randint(12, 480), rng.randint(12, 480)
  return (
    f"A tank measures {a} cm by {b} cm by {c} cm. How many litres does it hold?",
    _number(a * b * c / 1000),
  )  # an exact decimal: at most 3 places


def _change(rng):
  name, (x, y) = rng.choice(NAMES), rng.choice(ITEMS)
  px, py, nx, ny = rng.randint(2, 19), rng.randint(5, 49), rng.randint(3, 40), rng.randint(2, 25)
  total = px * nx + py * ny
  paid = (total // 100 + 1) * 100
  return (
    f"{name} buys {nx} {x} at ${px} each and {ny} {y} at ${py} each, and pays with "
    f"${paid}. How many dollars of change does {name} get?",
    paid - total,
  )


def _work_rate(rng):
  a, b = rng.choice([(2, 3), (3, 6), (4, 12), (6, 3), (5, 20), (10, 15), (12, 4), (8, 24)])
  return (
    f"One pump fills a pool in {a} hours and another in {b} hours. How many hours do they take together?",
    _number(a * b / (a + b)),
  )


def _number(x: float) -> str | int:
  return int(x) if float(x).is_integer() else f"{x:.3f}".rstrip("0")


KINDS = {
  "product": _product,
  "modpow": _modpow,
  "binomial": _binomial,
  "arrangements": _arrangements,
  "days_between": _days_between,
  "distance": _distance,
  "volume": _volume,
  "change": _change,
  "work_rate": _work_rate,
}


def is_test_question(question: str) -> bool:
  return hashlib.sha256(question.encode()).digest()[0] % 5 == 0


def _rows(n: int, seed: int, test: bool) -> list[dict]:
  rng = random.Random(seed)
  rows, seen = [], set()
  kinds = sorted(KINDS)
  while len(rows) < n:
    kind = kinds[len(rows) % len(kinds)] if rng.random() < 0.5 else rng.choice(kinds)
    question, value = KINDS[kind](rng)
    if value is None or is_test_question(question) != test or question in seen:
      continue
    seen.add(question)
    rows.append({"question": question, "answer": str(value), "kind": kind})
  return rows


def make_rows(n: int, seed: int) -> list[dict]:
  """n training problems (never a test question)."""
  return _rows(n, seed, test=False)


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """n held-out problems."""
  return _rows(n, 1_000_003 + seed, test=True)


def tokenizer_corpus(n: int = 400, seed: int = 12345) -> list[str]:
  """Texts for the task's tiny tokenizer (questions, answers, code-interpreter calls)."""
  texts = [SYSTEM_PROMPT] * 20 + ["<tool_response>\n", "\n</tool_response>"]
  for row in make_rows(n, seed):
    texts += [row["question"], row["answer"], '{"name": "code_interpreter", "arguments": {"code": "print(12 * 34)"}}']
  return texts
