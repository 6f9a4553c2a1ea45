"""QA rewards (SQuAD exact match / F1, aliases) and `math_equal` (math-verify) on hand-made pairs."""

from __future__ import annotations

import collections
import re
import string

import pytest
import trio

from agentfly_jax.rewards import exact_match, f1, get_reward, list_rewards, math_equal


def _reference_normalize(s):
  # The SQuAD v1.1 evaluation script's steps, written out independently.
  s = s.lower()
  s = "".join(ch for ch in s if ch not in set(string.punctuation))
  s = re.sub(r"\b(a|an|the)\b", " ", s)
  return " ".join(s.split())


def _reference_f1(prediction, gold):
  p, g = _reference_normalize(prediction).split(), _reference_normalize(gold).split()
  common = sum((collections.Counter(p) & collections.Counter(g)).values())
  if not p or not g:
    return float(p == g)
  if common == 0:
    return 0.0
  precision, recall = common / len(p), common / len(g)
  return 2 * precision * recall / (precision + recall)


@pytest.mark.parametrize(
  "prediction, answer, em, score",
  [
    ("The Eiffel Tower!", "eiffel tower", 1.0, 1.0),
    ("  an   apple.", "Apple", 1.0, 1.0),
    ("Paris, France", "Paris", 0.0, 2 / 3),
    ("Paris, France", ["Lyon", "Paris, France"], 1.0, 1.0),
    ("Varo Keltin", ["Keltin", "Varo Keltin"], 1.0, 1.0),
    ("Keltin", "Varo Keltin", 0.0, 2 / 3),
    ("the the", "a", 1.0, 1.0),  # both normalise to empty
    ("Lyon", "Paris", 0.0, 0.0),
    ("12 years", ["12", "12 years"], 1.0, 1.0),
    ("1,843", "1843", 1.0, 1.0),
    (None, "Paris", 0.0, 0.0),
  ],
)
def test_exact_match_and_f1(prediction, answer, em, score):
  assert exact_match(prediction, answer) == em
  assert f1(prediction, answer) == pytest.approx(score)


def test_f1_matches_the_squad_reference_on_random_strings():
  import random

  rng = random.Random(0)
  words = [
    "the",
    "a",
    "Paris",
    "paris",
    "tower",
    "Tower,",
    "of",
    "an",
    "light",
    "City",
    "x.",
    "!",
    "blue",
    "river",
    "old",
    "new",
  ]
  for _ in range(500):
    pred = " ".join(rng.choice(words) for _ in range(rng.randint(0, 6)))
    golds = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 3))]
    assert f1(pred, golds) == pytest.approx(max(_reference_f1(pred, g) for g in golds))
    assert exact_match(pred, golds) == float(any(_reference_normalize(pred) == _reference_normalize(g) for g in golds))


def test_empty_gold_is_an_error_naming_it():
  with pytest.raises(ValueError, match="gold answer is empty"):
    f1("x", [])


EQUIVALENT = [
  ("0.75", "3/4"),
  (r"\boxed{\frac{3}{4}}", "0.75"),
  (r"\frac{3}{4}", "0.75"),
  ("1,048,576", "1048576"),
  ("x = 3", "3"),
  ("3", "x=3"),
  ("x=-2", "-2"),
  ("The answer is 42.", "42"),
  (r"So the result is \boxed{7}.", "7"),
  ("2^{10}", "1024"),
  ("50%", "0.5"),
  ("3.0", "3"),
  ("2.50", "5/2"),
  (r"\dfrac{5}{2}", "2.5"),
  ("1/2", "0.5"),
  (r"\sqrt{2}/2", r"\frac{\sqrt{2}}{2}"),
  ("(1,2)", "(1, 2)"),
  (r"\{1,2\}", r"\{2,1\}"),
  ("x^2+2x+1", "(x+1)^2"),
  ("120", "5!"),
  ("10 apples", "10"),
  ("$1,000$", "1000"),
  (r"\boxed{-\frac{1}{2}}", "-0.5"),
  ("7", ["6", "7"]),
  ("0.333333", r"\frac{1}{3}"),
]
NOT_EQUIVALENT = [
  ("0.7", "3/4"),
  ("12", "13"),
  ("-5", "5"),
  ("2^{10}", "2"),
  (r"\frac{1}{3}", "0.3333"),
  ("x^2+1", "(x+1)^2"),
  (r"\boxed{8}", "7"),
  ("1048577", "1,048,576"),
  ("x = 4", "3"),
  ("(1,3)", "(1, 2)"),
  ("The answer is 41.", "42"),
  ("", "0"),
  ("no idea", "5"),
  ("7", ["6", "8"]),
  (r"\sqrt{3}", r"\sqrt{2}"),
  ("1/3", "0.3"),
]


@pytest.mark.parametrize("prediction, gold", EQUIVALENT)
def test_math_equal_accepts_equivalent_forms(prediction, gold):
  assert math_equal(prediction, gold) == 1.0


@pytest.mark.parametrize("prediction, gold", NOT_EQUIVALENT)
def test_math_equal_rejects_different_values(prediction, gold):
  assert math_equal(prediction, gold) == 0.0


def test_math_equal_in_a_worker_thread_and_none():
  # rollouts run sync rewards in threads (math-verify's SIGALRM timeout is main-thread only)
  assert trio.run(trio.to_thread.run_sync, lambda: math_equal(r"\frac{6}{8}", "0.75")) == 1.0
  assert math_equal(None, "1") == 0.0
  assert len(EQUIVALENT) + len(NOT_EQUIVALENT) >= 30 and len(NOT_EQUIVALENT) >= 15


def test_new_rewards_by_name():
  for name, fn in (("f1", f1), ("exact_match", exact_match), ("math_equal", math_equal)):
    assert get_reward(name) is fn and name in list_rewards()
