"""`webshop`: a WebShop-style shop (text mode) over a generated or loaded catalog.

Pages: search -> results (BM25 over the products, 10 per page, top 50) -> item (options,
description, features) -> buy. Actions as in WebShop: `search[query]` (on the search page) and
`click[button]` where the button is one of those the page lists ("back to search", "next >",
"< prev", a product id, an option value, "description", "features", "buy now"). Buying ends the
episode with WebShop's reward: r_type x (matched attributes + matched options + price ok) /
(goal attributes + goal options + 1), its parts in the info / the `purchase` env reward.

A row carries the goal: {"goal": {asin, attributes, goal_options, price_upper, ...}} (as written
by `make_goals` / the task-set generator). The action {"query": "valid_actions"} lists the page's
actions without acting.

Options (`--env-opt webshop.NAME=VALUE`): num_products (default 1000), catalog_seed (default 0),
or items_path (+ attributes_path) for WebShop's own product files.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import numpy as np

from envservers.env import ServerEnv, StepOutcome, env_reward
from envservers.envs.retrieval import import_bm25s  # bm25s without its JAX back-end
from envservers.envs.webshop_catalog import (
  DEFAULT_CATALOG_SEED,
  DEFAULT_NUM_PRODUCTS,
  generate_catalog,
  load_webshop_products,
)
from envservers.envs.webshop_policies import expert_actions, random_action  # noqa: F401 (their home moved)
from envservers.registry import register_env

RESULTS_PER_PAGE = 10
MAX_RESULTS = 50
_ACTION = re.compile(r"^\s*(search|click)\[(.*)\]\s*$", re.S | re.I)
_STOPWORDS = frozenset("a an and the of for with in on by to is that i need want".split())


def _words(text: str) -> set[str]:
  return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOPWORDS}


def _same_words(a: str, b: str) -> bool:
  """Loose match of two phrases: one's words contain the other's (like a token-set ratio)."""
  wa, wb = _words(a), _words(b)
  return bool(wa and wb) and (wa <= wb or wb <= wa)


def webshop_reward(product: dict, goal: dict, options: dict[str, str]) -> dict:
  """WebShop's reward for buying `product` with chosen `options` under `goal`.

  r_type: 1 if the product type (query) or >= 2 category levels match or > 20 % of the goal
  title's words are in the title; 0.5 otherwise; 0.1 below 10 % title overlap; 0 for none.
  Returns {reward, r_type, r_att, r_option, r_price} (shares in [0, 1]).
  """
  query_match = bool(product.get("query")) and product.get("query") == goal.get("query")
  cat_p = {c.strip() for c in product.get("category", "").split("›") if c.strip()}
  cat_g = {c.strip() for c in goal.get("category", "").split("›") if c.strip()}
  category_match = len(cat_p & cat_g) >= 2
  desired = _words(goal.get("name", ""))
  title_score = len(_words(product["name"]) & desired) / len(desired) if desired else 0.2
  r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
  if title_score < 0.1:
    r_type = 0.1
  if title_score == 0.0:
    r_type = 0.0
  text = " ".join([product["name"], product.get("description", ""), *product.get("features", [])])
  attr_hits = sum(
    1
    for a in goal["attributes"]
    if any(_same_words(a, b) for b in product.get("attributes", [])) or a.lower() in text.lower()
  )
  chosen = list(options.values())
  option_hits = sum(1 for v in goal["goal_options"].values() if any(_same_words(v, c) for c in chosen))
  price_ok = float(product["price"] <= goal["price_upper"])
  n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
  total = (attr_hits + option_hits + price_ok) / (n_att + n_opt + 1) * r_type
  return {
    "reward": float(total),
    "r_type": r_type,
    "r_att": attr_hits / n_att if n_att else 1.0,
    "r_option": option_hits / n_opt if n_opt else 1.0,
    "r_price": price_ok,
  }


class Shop:
  """The catalog and its BM25 index (shared by every instance of one server process)."""

  def __init__(self, products: list[dict]):
    self.products = products
    self.by_asin = {p["asin"]: p for p in products}
    texts = [" ".join([p["name"], p["query"], p["category"], *p["attributes"]]) for p in products]
    bm25s = import_bm25s()
    self.retriever = bm25s.BM25()
    self.retriever.index(bm25s.tokenize(texts, show_progress=False), show_progress=False)

  def search(self, query: str) -> list[dict]:
    tokens = import_bm25s().tokenize([query], show_progress=False)
    if not tokens.vocab:  # nothing searchable (only stop words)
      return []
    k = min(MAX_RESULTS, len(self.products))
    ids, scores = self.retriever.retrieve(tokens, k=k, show_progress=False)
    return [self.products[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]


@functools.lru_cache(maxsize=4)
def _shop(num_products: int, catalog_seed: int, items_path: str, attributes_path: str) -> Shop:
  if items_path:
    return Shop(load_webshop_products(items_path, attributes_path or None))
  return Shop(generate_catalog(num_products, catalog_seed))


@register_env
class WebShopEnv(ServerEnv):
  name = "webshop"
  call_timeout_s = 30.0

  def __init__(
    self,
    num_products: int = DEFAULT_NUM_PRODUCTS,
    catalog_seed: int = DEFAULT_CATALOG_SEED,
    items_path: str = "",
    attributes_path: str = "",
    max_steps: int = 50,
  ):
    if not isinstance(num_products, int) or num_products < 1:
      raise ValueError(f"webshop option 'num_products' must be a positive int, got {num_products!r}")
    self.catalog_key = (num_products, int(catalog_seed), str(items_path), str(attributes_path))
    self.max_steps = int(max_steps)
    self.shop: Shop | None = None
    self.goal: dict | None = None
    self._new_episode()

  def _new_episode(self) -> None:
    self.page, self.query, self.results, self.page_no = "search", "", [], 1
    self.item: dict | None = None
    self.options: dict[str, str] = {}
    self.done, self.steps, self.outcome = False, 0, None

  async def start(self) -> None:
    self.shop = _shop(*self.catalog_key)

  async def reset(self, row: dict | None) -> str:
    self._new_episode()
    self.goal = None
    if row is None:
      return ""
    goal = row.get("goal")
    if not isinstance(goal, dict):
      raise ValueError(
        f"webshop row needs a 'goal' object (asin, attributes, goal_options, price_upper); got {goal!r:.80}"
      )
    for field in ("asin", "attributes", "goal_options", "price_upper"):
      if field not in goal:
        raise ValueError(f"webshop row 'goal' lacks field {field!r}")
    if goal["asin"] not in self.shop.by_asin:
      raise ValueError(
        f"webshop row 'goal.asin' {goal['asin']!r} is not in this server's catalog (catalog options {self.catalog_key})"
      )
    self.goal = goal
    return self.render()

  # -- pages ------------------------------------------------------------------------------------

  def buttons(self) -> list[str]:
    """The clickable buttons of the current page (lower case)."""
    if self.page == "search":
      return []
    if self.page == "results":
      out = ["back to search"]
      if self.page_no > 1:
        out.append("< prev")
      if self.page_no * RESULTS_PER_PAGE < len(self.results):
        out.append("next >")
      return out + [p["asin"].lower() for p in self._page_results()]
    if self.page == "item":
      out = ["back to search", "< prev"]
      for values in self.item["options"].values():
        out += values
      return out + ["description", "features", "buy now"]
    return ["back to search", "< prev"]  # description / features sub-page

  def valid_actions(self) -> list[str]:
    if self.done:
      return []
    if self.page == "search":
      return ["search[<your query>]"]
    return [f"click[{b}]" for b in self.buttons()]

  def _page_results(self) -> list[dict]:
    start = (self.page_no - 1) * RESULTS_PER_PAGE
    return self.results[start : start + RESULTS_PER_PAGE]

  def render(self) -> str:
    instruction = f"Instruction: {self.goal['instruction_text']}" if self.goal else ""
    if self.page == "search":
      body = "[Search]"
    elif self.page == "results":
      lines = [f"Page {self.page_no} (Total results: {len(self.results)})"]
      for p in self._page_results():
        lines.append(f"[{p['asin']}] {p['name']} [SEP] ${p['price']:.2f}")
      if not self.results:
        lines.append(f"No products match {self.query!r}.")
      body = "\n".join(lines)
    elif self.page == "item":
      p = self.item
      lines = [p["name"], f"Price: ${p['price']:.2f}"]
      for name, values in p["options"].items():
        chosen = self.options.get(name)
        shown = [f"[{v}]" + (" (selected)" if v == chosen else "") for v in values]
        lines.append(f"{name}: {' '.join(shown)}")
      lines.append("[Description] [Features] [Buy Now]")
      body = "\n".join(lines)
    elif self.page == "description":
      body = f"Description: {self.item['description']}"
    else:
      body = "Features:\n" + "\n".join(f"- {f}" for f in self.item["features"])
    return "\n".join([x for x in (instruction, body) if x] + [f"Available actions: {', '.join(self.valid_actions())}"])

  # -- actions ----------------------------------------------------------------------------------

  def _bad(self, message: str) -> StepOutcome:
    return StepOutcome(observation=f"Invalid action: {message}\n{self.render()}", info={"error": "BadAction"})

  async def step(self, action: Any) -> StepOutcome:
    if isinstance(action, dict) and action.get("query") == "valid_actions":
      return StepOutcome(observation="\n".join(self.valid_actions()), info={"query": True})
    if self.goal is None:
      return StepOutcome(
        observation="Error: no episode: reset with a row that has a 'goal' first", info={"error": "NoEpisode"}
      )
    if self.done:
      return StepOutcome(
        observation=f"The episode is over: you bought {self.outcome['asin']}; no further actions are possible.",
        done=True,
        info={"error": "EpisodeOver"},
      )
    if not isinstance(action, str):
      return self._bad(f"an action is a string like search[...] or click[...], got {type(action).__name__}")
    match = _ACTION.match(action)
    if not match:
      return self._bad(f"{action!r:.80} is not search[...] or click[...]")
    kind, argument = match.group(1).lower(), match.group(2).strip()
    self.steps += 1
    if kind == "search":
      if self.page != "search":
        return self._bad("search is only possible on the search page (click[back to search])")
      if not argument:
        return self._bad("search[] needs a query")
      self.query, self.results, self.page_no = argument, self.shop.search(argument), 1
      self.page = "results"
      return self._outcome()
    return self._click(argument.lower())

  def _outcome(self, reward: float | None = None, info: dict | None = None) -> StepOutcome:
    done = self.done
    if not done and self.steps >= self.max_steps:
      done = self.done = True
      self.outcome = {"asin": "nothing (step limit)", "reward": 0.0}
    return StepOutcome(
      observation=self.render()
      if not self.done
      else f"Thank you for shopping with us! Your score: {reward or 0.0:.3f}",
      reward=reward,
      done=done,
      info=info or {},
    )

  def _click(self, button: str) -> StepOutcome:
    if button not in self.buttons():
      return self._bad(f"click[{button}] is not a button on this page")
    if button == "back to search":
      self.page, self.item, self.options = "search", None, {}
    elif button == "next >":
      self.page_no += 1
    elif button == "< prev":
      if self.page == "results":
        self.page_no -= 1
      elif self.page == "item":
        self.page, self.item, self.options = "results", None, {}
      else:
        self.page = "item"
    elif self.page == "results":
      self.item = self.shop.by_asin[next(p["asin"] for p in self._page_results() if p["asin"].lower() == button)]
      self.page, self.options = "item", {}
    elif button in ("description", "features"):
      self.page = button
    elif button == "buy now":
      parts = webshop_reward(self.item, self.goal, self.options)
      self.done = True
      self.outcome = {"asin": self.item["asin"], "options": dict(self.options), **parts}
      return self._outcome(parts["reward"], {"purchased": self.item["asin"], **parts})
    else:  # an option value
      for name, values in self.item["options"].items():
        if button in values:
          self.options[name] = button
          break
    return self._outcome()

  @env_reward("purchase")
  def purchase(self) -> dict:
    """WebShop's reward of the purchase (0 if nothing was bought), with its parts."""
    if not self.outcome or "r_type" not in self.outcome:
      return {"reward": 0.0, "bought": 0.0, "r_type": 0.0, "r_att": 0.0, "r_option": 0.0, "r_price": 0.0}
    return {
      "reward": self.outcome["reward"],
      "bought": 1.0,
      **{k: self.outcome[k] for k in ("r_type", "r_att", "r_option", "r_price")},
    }
