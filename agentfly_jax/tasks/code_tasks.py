"""The code task: write a Python function; hidden unit tests score it (`code_pass_rate`).

Each problem family has a statement, a function name and a reference solution; a row draws
fresh test inputs with a seeded RNG and records the reference's outputs as the hidden tests
(`tests`: [{"args": [...], "expected": ...}]). The model sees only the question (with one
example call). Train and test rows come from disjoint seeds; held-out families (`TEST_FAMILIES`)
appear only in the test split, so the test split also measures transfer to unseen problems.
"""

from __future__ import annotations

import random

from agentfly_jax.rewards.code import code_pass_rate
from agentfly_jax.tools.builtin import answer, code_interpreter

SYSTEM_PROMPT = (
  "Write the requested Python function. You may test it with the code "
  "interpreter; then call answer with the complete function source."
)
TOOLS = (code_interpreter, answer)
REWARD = code_pass_rate


def _ints(rng, n, lo=-50, hi=50):
  return [rng.randint(lo, hi) for _ in range(n)]


def _word(rng, letters="abcde", lo=0, hi=12):
  return "".join(rng.choice(letters) for _ in range(rng.randint(lo, hi)))


# name -> (statement, entry point, reference, input generator)
FAMILIES = {
  "sum_even_squares": (
    "Write a function `sum_even_squares(xs)` that returns the sum of the squares of the even "
    "integers in the list `xs`.",
    "sum_even_squares",
    lambda xs: sum(x * x for x in xs if x % 2 == 0),
    lambda rng: [_ints(rng, rng.randint(0, 10))],
  ),
  "is_palindrome": (
    "Write a function `is_palindrome(s)` that returns True if the string `s` reads the same "
    "backwards, ignoring case and non-letter characters, else False.",
    "is_palindrome",
    lambda s: (lambda t: t == t[::-1])([c.lower() for c in s if c.isalpha()]),
    lambda rng: [rng.choice([_word(rng, "abA b"), (lambda w: w + w[::-1])(_word(rng, "abcA,"))])],
  ),
  "run_length": (
    "Write a function `run_length(s)` that returns the run-length encoding of the string `s` "
    "as a list of [character, count] pairs, e.g. run_length('aab') == [['a', 2], ['b', 1]].",
    "run_length",
    lambda s: [[c, n] for c, n in _runs(s)],
    lambda rng: [_word(rng, "aab")],
  ),
  "rotate": (
    "Write a function `rotate(xs, k)` that returns the list `xs` rotated right by `k` places "
    "(k may be larger than the length or negative; an empty list stays empty).",
    "rotate",
    lambda xs, k: xs[-(k % len(xs)) :] + xs[: -(k % len(xs))] if xs else [],
    lambda rng: [_ints(rng, rng.randint(0, 8)), rng.randint(-20, 20)],
  ),
  "second_largest": (
    "Write a function `second_largest(xs)` that returns the second largest distinct value in "
    "the list `xs`, or None if there is none.",
    "second_largest",
    lambda xs: sorted(set(xs))[-2] if len(set(xs)) > 1 else None,
    lambda rng: [_ints(rng, rng.randint(0, 7), -5, 5)],
  ),
  "digit_sum": (
    "Write a function `digit_sum(n)` that returns the sum of the decimal digits of the integer `n` (ignore the sign).",
    "digit_sum",
    lambda n: sum(int(c) for c in str(abs(n))),
    lambda rng: [rng.randint(-(10**12), 10**12)],
  ),
  "count_vowels": (
    "Write a function `count_vowels(s)` that returns how many characters of `s` are vowels "
    "(a, e, i, o, u, either case).",
    "count_vowels",
    lambda s: sum(c in "aeiouAEIOU" for c in s),
    lambda rng: [_word(rng, "aeXYzuIo ")],
  ),
  "fib": (
    "Write a function `fib(n)` that returns the n-th Fibonacci number, with fib(0) == 0 and fib(1) == 1.",
    "fib",
    lambda n: _fib(n),
    lambda rng: [rng.randint(0, 80)],
  ),
  "merge_sorted": (
    "Write a function `merge_sorted(a, b)` that merges two sorted lists into one sorted list.",
    "merge_sorted",
    lambda a, b: sorted(a + b),
    lambda rng: [sorted(_ints(rng, rng.randint(0, 6))), sorted(_ints(rng, rng.randint(0, 6)))],
  ),
  "word_lengths": (
    "Write a function `word_lengths(text)` that returns a dict mapping each distinct "
    "whitespace-separated word of `text` to its length.",
    "word_lengths",
    lambda text: {w: len(w) for w in text.split()},
    lambda rng: [" ".join(_word(rng, "abcd", 1, 5) for _ in range(rng.randint(0, 6)))],
  ),
}
TEST_FAMILIES = ("merge_sorted", "word_lengths")


def _runs(s):
  out = []
  for c in s:
    if out and out[-1][0] == c:
      out[-1][1] += 1
    else:
      out.append([c, 1])
  return out


def _fib(n):
  a, b = 0, 1
  for _ in range(n):
    a, b = b, a + b
  return a


def make_problem(family: str, rng: random.Random, num_tests: int = 8) -> dict:
  """One row: the question (with an example call), entry point and hidden tests."""
  statement, entry, reference, inputs = FAMILIES[family]
  tests = []
  for _ in range(num_tests):
    args = inputs(rng)
    tests.append({"args": args, "expected": reference(*[list(a) if isinstance(a, list) else a for a in args])})
  example = tests[0]
  shown = ", ".join(repr(a) for a in example["args"])
  question = f"{statement} Example: {entry}({shown}) == {example['expected']!r}."
  return {"question": question, "entry_point": entry, "tests": tests, "family": family}


def _rows(n: int, seed: int, families) -> list[dict]:
  rng = random.Random(seed)
  return [make_problem(rng.choice(families), rng) for _ in range(n)]


def make_rows(n: int, seed: int) -> list[dict]:
  """n training problems (families outside TEST_FAMILIES; even seeds of the row stream)."""
  return _rows(n, 2 * seed, [f for f in FAMILIES if f not in TEST_FAMILIES])


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """n held-out problems (all families, odd seeds; TEST_FAMILIES never appear in training)."""
  return _rows(n, 2 * seed + 1, list(FAMILIES))


def reference_source(family: str) -> str:
  """A correct submission for `family` (for tests and demonstrations)."""
  return _REFERENCE_SOURCES[family]


_REFERENCE_SOURCES = {
  "sum_even_squares": "def sum_even_squares(xs):\n  return sum(x * x for x in xs if x % 2 == 0)\n",
  "is_palindrome": ("def is_palindrome(s):\n  t = [c.lower() for c in s if c.isalpha()]\n  return t == t[::-1]\n"),
  "run_length": (
    "def run_length(s):\n  out = []\n  for c in s:\n    if out and out[-1][0] == c:\n"
    "      out[-1][1] += 1\n    else:\n      out.append([c, 1])\n  return out\n"
  ),
  "rotate": (
    "def rotate(xs, k):\n  if not xs:\n    return []\n  k %= len(xs)\n  return xs[-k:] + xs[:-k] if k else list(xs)\n"
  ),
  "second_largest": ("def second_largest(xs):\n  s = sorted(set(xs))\n  return s[-2] if len(s) > 1 else None\n"),
  "digit_sum": "def digit_sum(n):\n  return sum(int(c) for c in str(abs(n)))\n",
  "count_vowels": "def count_vowels(s):\n  return sum(c in 'aeiouAEIOU' for c in s)\n",
  "fib": "def fib(n):\n  a, b = 0, 1\n  for _ in range(n):\n    a, b = b, a + b\n  return a\n",
  "merge_sorted": "def merge_sorted(a, b):\n  return sorted(a + b)\n",
  "word_lengths": "def word_lengths(text):\n  return {w: len(w) for w in text.split()}\n",
}


def tokenizer_corpus(n: int = 200, seed: int = 12345) -> list[str]:
  """Texts for the task's tiny tokenizer (statements, reference solutions, tool calls)."""
  texts = [SYSTEM_PROMPT] * 20 + ["<tool_response>\n", "\n</tool_response>"]
  texts += [row["question"] for row in make_rows(n, seed)]
  texts += list(_REFERENCE_SOURCES.values()) * 4
  return texts
