"""WebShop-style shopping: find and buy the product an instruction describes.

Rows: {"question": instruction, "goal": {asin, name, query, category, attributes, goal_options,
price_upper, instruction_text}, "split"}; goals are drawn from the env server's catalog (its
default: 1,000 generated products, seed 0); its products are split by a hash of the asin into
train / dev (the eval during training) / test (locked: `make_test_rows`, the final evaluation only),
so no dev or test goal product is ever a training goal (search results may still show them). Tool `shop`
(one action: search[query] or click[button]); reward: WebShop's purchase reward (r_type x share of
matched attributes, options and price), its parts as metrics.
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np

from agentfly_jax.data import row_fields
from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from agentfly_jax.tools import tool
from envservers.api import (
  DEFAULT_CATALOG_SEED,
  DEFAULT_NUM_PRODUCTS,
  expert_actions,
  generate_catalog,
  make_goals,
  random_action,
)

ENV = "webshop"
NUM_PRODUCTS, CATALOG_SEED = DEFAULT_NUM_PRODUCTS, DEFAULT_CATALOG_SEED  # the env's (rows come from its catalog)
SYSTEM_PROMPT = (
  "You shop on a web store. Act with the shop tool: search[query] on the search "
  "page, click[button] on the others. Buy the product the instruction describes."
)


@tool(name="shop", env=ENV)
async def shop(action: str, env) -> StepResult:
  """Acts in the web shop.

  Args:
    action: search[query] or click[button], e.g. click[buy now].
  """
  return await env.step(action)  # a StepResult: its `done` (a purchase) ends the chain


@tool(name="valid_actions", env=ENV)
async def valid_actions(env) -> str:
  """Lists the actions possible on the current page."""
  return (await env.step({"query": "valid_actions"})).observation


@reward(name="webshop_purchase", env=ENV)
async def purchase_reward(env) -> dict:
  """WebShop's reward of what the chain bought (0 if nothing), with r_type/r_att/r_option/r_price."""
  return await env.compute_reward("purchase")


TOOLS = (shop, valid_actions)
REWARD = purchase_reward
REWARD_ONLY_FIELDS = (*row_fields.REWARD_ONLY_FIELDS, "goal")  # the goal product (its asin, name, values): the env's


@functools.lru_cache(maxsize=2)
def catalog(num_products: int = NUM_PRODUCTS, seed: int = CATALOG_SEED) -> list[dict]:
  return generate_catalog(num_products, seed)


def _rows(goals: list[dict], split: str) -> list[dict]:
  return [{"question": g["instruction_text"], "goal": g, "split": split} for g in goals]


def product_split(asin: str) -> str:
  """The split a catalog product's goals belong to, by a fixed hash of its asin: ~10 % test (the
  locked split, read only by the final evaluation), ~10 % dev (evals during training, choosing
  recipes), the rest train. A test or dev product is never a training goal (nor a demo's)."""
  bucket = int(hashlib.sha256(f"agentfly-webshop-split:{asin}".encode()).hexdigest()[:8], 16) % 10
  return {0: "test", 1: "dev"}.get(bucket, "train")


@functools.lru_cache(maxsize=6)
def split_products(split: str) -> tuple[dict, ...]:
  """The catalog's products whose goals belong to `split` ("train" | "dev" | "test")."""
  return tuple(p for p in catalog() if product_split(p["asin"]) == split)


def make_rows(n: int, seed: int) -> list[dict]:
  """n training rows (goals over the train products, from seed `seed`)."""
  return _rows(make_goals(list(split_products("train")), n, seed=2 * seed), "train")


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """n dev rows: goals over the dev products (never in training)."""
  return _rows(make_goals(list(split_products("dev")), n, seed=2 * seed + 1), "dev")


def make_test_rows(n: int, seed: int) -> list[dict]:
  """n rows of the locked test split: goals over the test products (in neither train nor dev)."""
  return _rows(make_goals(list(split_products("test")), n, seed=2 * seed + 1), "test")


def make_agent(tokenizer):
  return world_agent(tokenizer, TOOLS, REWARD, SYSTEM_PROMPT, ENV)


def expert_policy(row: dict, observation: str) -> str:
  """The goal path's next shop action."""
  return expert_actions(observation, row["goal"])


def random_policy(row: dict, observation: str, rng: np.random.Generator) -> str:
  """A uniformly random valid action; searches use a random product type."""
  return random_action(observation, rng, sorted({p["query"] for p in catalog()}))


def tokenizer_corpus(n: int = 200, seed: int = 0) -> list[str]:
  texts = [SYSTEM_PROMPT] * 10
  for p in catalog()[:n]:
    texts += [p["name"], " ".join(p["attributes"]), " ".join(sum(p["options"].values(), []))]
  for row in make_rows(n, seed):
    texts += [
      row["question"],
      tool_call_text("shop", action=f"search[{row['goal']['name']}]"),
      tool_call_text("shop", action="click[buy now]"),
    ]
  return texts
