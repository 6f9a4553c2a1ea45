"""Every learning task has train / dev / locked test rows, and what each split's rows are about
(keys, expressions, goal products, the entities both hops query, SWE repositories) never occurs in another: computed
from the rows the task generates, not from the split rule."""

import os
import re

import pytest

from agentfly_jax.tasks import arithmetic, arithmetic_brief, lookup, multihop_qa, multihop_qa_brief_2hop
from agentfly_jax.tasks import webshop, webshop_brief
from agentfly_jax.tasks.contract import task_spec


def _splits(module, n_train: int, n_eval: int) -> dict[str, list[dict]]:
  spec = task_spec(module)
  rows = {
    "train": spec.make_rows(n_train, seed=0) + spec.make_rows(n_train, seed=1),
    "dev": spec.make_eval_rows(n_eval, seed=0) + spec.make_eval_rows(n_eval, seed=1),
    "test": spec.make_test_rows(n_eval, seed=0) + spec.make_test_rows(n_eval, seed=1),
  }
  assert all(rows.values()), {k: len(v) for k, v in rows.items()}
  return rows


def _assert_disjoint(items: dict[str, set]) -> None:
  assert all(items.values()), "a split has no items"
  for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
    assert not items[a] & items[b], f"{a} and {b} share {sorted(items[a] & items[b])[:5]}"


def test_lookup_keys_of_the_three_splits_are_disjoint():
  rows = _splits(lookup, 2000, 400)
  keys = {k: {re.search(r'key "([a-z-]+)"', r["question"]).group(1) for r in v} for k, v in rows.items()}
  _assert_disjoint(keys)
  assert len(keys["train"]) > 1000 and 56 <= len(keys["dev"]) <= 64 and 56 <= len(keys["test"]) <= 64
  # a new key is made of what training wrote: every syllable at every place of the train keys
  places = [{k.split("-")[i] for k in keys["train"]} for i in range(3)]
  assert all(p == set(lookup.SYLLABLES) for p in places), places


@pytest.mark.parametrize("warmstart", ["lookup_warmstart", "lookup_warmstart_moe"])
def test_lookup_warm_start_was_built_from_the_train_split_only(warmstart):
  """A shipped warm start's (dense and mixture-of-experts) SFT demonstrations were drawn from the train
  keys of the split the task has now (its warmstart.json records the hash of those keys and of the dev +
  test keys it left out)."""
  import json
  import os

  from train_cli import ROOT

  with open(os.path.join(ROOT, "experiments", "results", warmstart, "warmstart.json")) as f:
    recipe = json.load(f)
  assert recipe["demo_keys"] == lookup.keys_fingerprint("train"), "the warm start predates the split: rebuild it"
  assert recipe["held_out_keys"] == lookup.keys_fingerprint("dev", "test")


def test_calculator_expressions_of_the_three_splits_are_disjoint():
  rows = _splits(arithmetic, 600, 150)
  _assert_disjoint({k: {r["expression"] for r in v} for k, v in rows.items()})
  brief = task_spec(arithmetic_brief)  # the brief prompt's task: the same three splits
  assert (brief.generate_rows, brief.generate_eval_rows, brief.generate_test_rows) == (
    arithmetic.make_rows,
    arithmetic.make_eval_rows,
    arithmetic.make_test_rows,
  )


@pytest.mark.parametrize("module", [webshop, webshop_brief])
def test_shop_test_products_never_appear_in_train_or_dev(module):
  rows = _splits(module, 3000, 200)
  _assert_disjoint({k: {r["goal"]["asin"] for r in v} for k, v in rows.items()})
  assert {r["split"] for r in rows["test"]} == {"test"}


def _hop_titles(row: dict) -> set[str]:
  """The titles of the passages each hop of the question reads (its entity, then the bridge
  entity or the second compared one), as the knowledge base recorded them."""
  return set(row["supporting_titles"])


@pytest.mark.parametrize("module", [multihop_qa, multihop_qa_brief_2hop])
def test_multihop_test_entities_of_both_hops_never_appear_in_train_or_dev(module):
  spec = task_spec(module)
  # every row of each split (the train rows sampled widely; dev / test are fixed sets)
  rows = {
    "train": spec.make_rows(30000, seed=0),
    "dev": spec.make_eval_rows(10_000, seed=0),
    "test": spec.make_test_rows(10_000, seed=0),
  }
  assert len(rows["test"]) >= 100 and len(rows["dev"]) >= 64
  assert all(r["type"] != "1-hop" for r in rows["test"] + rows["dev"])
  assert all(len(_hop_titles(r)) == 2 for r in rows["test"])  # both hops' entities counted
  _assert_disjoint({k: set().union(*(_hop_titles(r) for r in v)) for k, v in rows.items()})


def test_swe_repositories_of_the_three_splits_are_disjoint():
  """SWE tasks split by repository: a dev or test task's code, issue and hidden tests come from a repository
  no train task uses; the rows each split's function gives are that split's tasks, every one of them; the
  tokenizer corpus of a random-init model reads the train tasks only."""
  from agentfly_jax.tasks import swe
  from envservers.envs import swe_tasks

  spec = task_spec(swe)
  rows = {
    "train": spec.make_rows(2000, seed=0),
    "dev": spec.make_eval_rows(100, 0),
    "test": spec.make_test_rows(100, 0),
  }
  ids = {k: {r["task_id"] for r in v} for k, v in rows.items()}
  for split, task_ids in ids.items():
    assert task_ids == set(swe_tasks.shipped_task_ids(split)), split  # each split whole, and only it
    assert {r["split"] for r in rows[split]} == {split}
  repos = {k: {swe_tasks.shipped_task_meta(t)["repo_name"] for t in v} for k, v in ids.items()}
  _assert_disjoint(repos)
  for split, names in repos.items():  # the repository each task names is shipped in its own split's folder
    assert names == set(os.listdir(os.path.join(swe_tasks.REPOS_DIR, split))), split
  corpus = "\n".join(swe.tokenizer_corpus())
  held_out = [swe_tasks.shipped_task_meta(t)["problem_statement"] for t in ids["dev"] | ids["test"]]
  assert not [p for p in held_out if p in corpus]
  assert all(swe_tasks.shipped_task_meta(t)["problem_statement"] in corpus for t in ids["train"])
