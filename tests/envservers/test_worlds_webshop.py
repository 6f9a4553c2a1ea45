"""The webshop world: catalog, WebShop reward, loader, and expert/random policies through a real
env server."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.tasks import webshop as task
from envservers.envs.webshop import WebShopEnv, expert_actions, webshop_reward
from envservers.envs.webshop_catalog import generate_catalog, load_webshop_products, make_goals
from envservers_helpers import running_server
from worlds_helpers import play


@pytest.fixture(scope="module")
def shop_server():
  with running_server("webshop=4:1") as server:
    yield server


def test_catalog_is_seeded_large_and_varied():
  a, b, c = generate_catalog(1000, 0), generate_catalog(1000, 0), generate_catalog(1000, 1)
  assert a == b and a != c and len(a) == 1000
  assert len({p["asin"] for p in a}) == 1000
  assert len({p["category"].split(" › ")[0] for p in a}) >= 5
  assert len({p["query"] for p in a}) >= 20
  assert all(p["options"] and p["attributes"] and p["price"] > 0 for p in a)
  assert {"size", "color"} <= {name for p in a for name in p["options"]}
  with pytest.raises(ValueError, match="num_products"):
    generate_catalog(0, 0)


def test_webshop_reward_matches_its_formula_on_random_goals():
  products = generate_catalog(300, 5)
  rng = np.random.default_rng(11)
  for goal in make_goals(products, 40, seed=int(rng.integers(1 << 30))):
    product = next(p for p in products if p["asin"] == goal["asin"])
    assert product["price"] < goal["price_upper"]
    perfect = webshop_reward(product, goal, dict(goal["goal_options"]))
    assert perfect == {"reward": 1.0, "r_type": 1.0, "r_att": 1.0, "r_option": 1.0, "r_price": 1.0}
    # Wrong options, cheap enough: (attributes + price) / (attributes + options + 1).
    wrong = {k: "no such value" for k in goal["goal_options"]}
    n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
    got = webshop_reward(product, goal, wrong)
    assert got["reward"] == pytest.approx((n_att + 1) / (n_att + n_opt + 1))
    assert got["r_option"] == 0.0
    # Too expensive: the price share drops out.
    pricey = dict(product, price=goal["price_upper"] + 1)
    assert webshop_reward(pricey, goal, dict(goal["goal_options"]))["r_price"] == 0.0
  # Another product type in another top category with no shared title word: r_type 0.
  goal = make_goals(products, 1, seed=3)[0]
  other = next(
    p
    for p in products
    if p["category"].split(" › ")[0] != goal["category"].split(" › ")[0]
    and not set(p["name"].lower().split()) & set(goal["name"].lower().split())
  )
  assert webshop_reward(other, goal, {})["reward"] == 0.0


def test_expert_solves_every_test_instruction_and_random_scores_low(shop_server):
  rows = task.make_eval_rows(12, seed=0)
  rng = np.random.default_rng(0)

  async def expert(observation, env):
    return expert_actions(observation, row["goal"])

  async def random_policy(observation, env):
    return task.random_policy(row, observation, rng)

  async def main():
    nonlocal row
    manager = EnvManager([shop_server.address])
    expert_rewards, random_rewards = [], []
    for row in rows:
      result = await play(manager, "webshop", row, expert, 40, "purchase")
      expert_rewards.append(result["reward"])
      assert result["done"] and result["step_rewards"] == pytest.approx(result["reward"])
      assert result["r_type"] == result["r_att"] == result["r_option"] == result["r_price"] == 1.0
      random_rewards.append((await play(manager, "webshop", row, random_policy, 15, "purchase"))["reward"])
    await manager.aclose()
    return expert_rewards, random_rewards

  row = None
  expert_rewards, random_rewards = trio.run(main)
  print(
    f"webshop: expert mean reward {np.mean(expert_rewards):.3f} over {len(rows)}, random {np.mean(random_rewards):.3f}"
  )
  assert expert_rewards == [1.0] * len(rows)
  assert np.mean(random_rewards) < 0.3


def test_bad_actions_give_informative_observations():
  async def main():
    env = WebShopEnv(num_products=200)
    await env.start()
    row = {"goal": make_goals(env.shop.products, 1, seed=2)[0]}
    first = await env.reset(row)
    assert "Instruction:" in first and "search[<your query>]" in first
    cases = {
      "click[foo": "is not search[...] or click[...]",
      "click[buy now]": "not a button on this page",
      "search[]": "needs a query",
      "jump around": "is not search[...] or click[...]",
    }
    for action, words in cases.items():
      out = await env.step(action)
      assert words in out.observation and out.info["error"] == "BadAction" and not out.done
    out = await env.step({"code": 1})
    assert "got dict" in out.observation
    await env.step(f"search[{row['goal']['name']}]")
    assert "only possible on the search page" in (await env.step("search[shoes]")).observation
    for _ in range(10):  # the expert's path, then act after the purchase
      out = await env.step(expert_actions(env.render(), row["goal"]))
      if out.done:
        break
    assert out.done and out.reward == 1.0
    after = await env.step("click[back to search]")
    assert after.done and after.info["error"] == "EpisodeOver" and "over" in after.observation
    with pytest.raises(ValueError, match="goal.asin"):
      await env.reset({"goal": {**row["goal"], "asin": "B0NOPE"}})
    with pytest.raises(ValueError, match="'goal'"):
      await env.reset({"question": "x"})

  trio.run(main)


def test_loader_reads_webshop_files_and_serves_them(tmp_path):
  rng = np.random.default_rng(4)
  items, attrs = [], {}
  for i in range(30):
    asin = f"B0TEST{i:04d}"
    colors = [str(c) for c in rng.choice(["red", "blue", "green", "black"], 2, replace=False)]
    kind = ["desk lamp", "wool socks", "tea kettle"][i % 3]
    items.append(
      {
        "asin": asin,
        "name": f"Brand{i} {kind} model {i}",
        "query": kind,
        "product_category": f"home › misc › {kind}",
        "pricing": f"${10 + i}.99",
        "customization_options": {"Color": [{"value": c, "image": None} for c in colors]},
        "small_description": [f"feature {i}"],
        "full_description": f"A {kind}.",
      }
    )
    attrs[asin] = {"attributes": ["energy efficient" if i % 2 else "easy clean"]}
  items_path, attrs_path = tmp_path / "items_shuffle.json", tmp_path / "items_ins_v2.json"
  items_path.write_text(json.dumps(items))
  attrs_path.write_text(json.dumps(attrs))
  products = load_webshop_products(str(items_path), str(attrs_path))
  assert len(products) == 30 and products[3]["price"] == 13.99
  assert products[3]["options"]["color"] == [
    c.lower() for c in [o["value"] for o in items[3]["customization_options"]["Color"]]
  ]
  assert products[4]["attributes"] == ["easy clean"]
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps([{"asin": "B1", "name": "x", "pricing": "free"}]))
  with pytest.raises(ValueError, match="item 0: field 'pricing'"):
    load_webshop_products(str(bad))

  goals = make_goals(products, 5, seed=1)
  with running_server(
    "webshop=1:1", options=(f"webshop.items_path={items_path}", f"webshop.attributes_path={attrs_path}")
  ) as server:

    async def main():
      manager = EnvManager([server.address])
      rewards = []
      for goal in goals:

        async def expert(observation, env, goal=goal):
          return expert_actions(observation, goal)

        rewards.append((await play(manager, "webshop", {"goal": goal}, expert, 40, "purchase"))["reward"])
      await manager.aclose()
      return rewards

    assert trio.run(main) == [1.0] * len(goals)


def test_env_server_side_stays_jax_free():
  code = (
    "import sys, envservers.envs\n"
    "from envservers.envs.webshop import Shop\n"
    "from envservers.envs.webshop_catalog import generate_catalog\n"
    "assert Shop(generate_catalog(100, 0)).search('running shoes')\n"
    "assert 'jax' not in sys.modules, 'envservers imported JAX'\n"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
