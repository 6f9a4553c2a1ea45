"""The `miniwob` env: action parsing and the GUI reward by hand-worked cases; in a real headless Chromium
through a real env server, a scripted policy that reads the target from the page's DOM at full task and
GUI reward on click-test, click-test-2 and click-button, a seeded random clicker low; the browser's
processes gone after close; enter-text through click, type and key actions."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest
import trio

from envservers import images
from envservers.client import Connection
from envservers.envs.browser import processes_with
from envservers.envs.miniwob_env import MiniWoBEnv, gui_action_reward, parse_action
from envservers_helpers import running_server

TASKS = ("click-test", "click-test-2", "click-button")
SEEDS = range(3)


def _have_browser() -> bool:
  try:
    import miniwob  # noqa: F401
    import selenium  # noqa: F401
  except ImportError:
    return False
  return all(os.path.exists(p) for p in ("/usr/bin/chromium", "/usr/bin/chromedriver"))


needs_browser = pytest.mark.skipif(not _have_browser(), reason="chromium, chromedriver, selenium, miniwob (.ci/setup)")


def test_actions_are_parsed_and_bad_ones_named():
  assert parse_action('{"action": "click", "x": 3, "y": 209.5}') == {"action": "click", "x": 3.0, "y": 209.5}
  assert parse_action({"action": "type", "text": "hi"}) == {"action": "type", "text": "hi"}
  assert parse_action({"action": "key", "key": "Enter"}) == {"action": "key", "key": "Enter"}
  for action, words in (
    ("click(3, 4)", "JSON object"),
    ([1, 2], "got list"),
    ({"action": "click", "x": 160, "y": 1}, r"'x' must be a number in \[0, 160\)"),
    ({"action": "click", "x": 1, "y": True}, "'y' must be a number"),
    ({"action": "type", "text": ""}, "'text' must be a string of 1-256"),
    ({"action": "key", "key": "F13"}, "'key' must be one of"),
    ({"action": "drag"}, "'action' must be 'click', 'type' or 'key'"),
  ):
    with pytest.raises(ValueError, match=words):
      parse_action(action)


def test_gui_reward_needs_the_type_and_the_box_or_text():
  target = {"action": "click", "box": [10.0, 20.0, 30.0, 40.0]}
  assert gui_action_reward({"action": "click", "x": 10.0, "y": 39.9}, target)["reward"] == 1.0
  assert gui_action_reward({"action": "click", "x": 30.0, "y": 25.0}, target) == {
    "reward": 0.0,
    "type_match": 1.0,
    "hit": 0.0,
  }
  assert gui_action_reward({"action": "type", "text": "x"}, target)["type_match"] == 0.0
  typed = {"action": "type", "text": "Hello, World"}
  assert gui_action_reward({"action": "type", "text": "hello world!"}, typed)["reward"] == 1.0
  assert gui_action_reward({"action": "type", "text": "hello"}, typed)["reward"] == 0.0
  assert gui_action_reward({"action": "key", "key": "Enter"}, {"action": "key", "key": "Enter"})["reward"] == 1.0
  assert gui_action_reward(None, target)["reward"] == 0.0 and gui_action_reward(typed, None)["reward"] == 0.0


def scripted(instruction: str, elements: list[dict]) -> dict:
  """Finds the element the instruction names in the DOM and clicks its centre."""
  quoted = re.search(r'"(.*)"', instruction)
  if quoted:  # click-button: Click on the "X" button.
    pick = next(e for e in elements if e["tag"] == "button" and e["text"] == quoted.group(1))
  else:  # click-test: the one button; click-test-2: the button whose label the instruction says
    buttons = [e for e in elements if e["tag"] == "button"]
    pick = next((e for e in buttons if e["text"] and e["text"] in instruction), buttons[0])
  left, top, right, bottom = pick["box"]
  return {"action": "click", "x": (left + right) / 2, "y": (top + bottom) / 2}


async def _episode(conn: Connection, task: str, seed: int, policy, max_steps: int) -> tuple[float, float, int]:
  args = {"env": "miniwob", "chain_id": f"{task}-{seed}"}
  await conn.call("acquire", args)
  try:
    text, shot = (await conn.call("reset", {**args, "row": {"task": task, "seed": seed}}))["observation"]
    assert text["type"] == "text" and images.decode_image_part(shot).size == (160, 210)
    instruction = text["text"].split("\n")[0].removeprefix("Task: ")
    steps = 0
    for steps in range(1, max_steps + 1):
      elements = json.loads((await conn.call("step", {**args, "action": {"query": "elements"}}))["observation"])
      out = await conn.call("step", {**args, "action": json.dumps(policy(instruction, elements))})
      if out["done"]:
        break
    task_reward = (await conn.call("compute_reward", {**args, "name": "task"}))["reward"]
    gui = (await conn.call("compute_reward", {**args, "name": "gui_action"}))["reward"]
    return task_reward, gui, steps
  finally:
    await conn.call("release", args)


@pytest.mark.slow
@needs_browser
def test_scripted_policy_full_reward_random_clicker_low_through_a_server():
  rng = np.random.default_rng(0)

  def random_clicker(instruction, elements):
    return {"action": "click", "x": float(rng.uniform(0, 160)), "y": float(rng.uniform(0, 210))}

  async def main():
    conn = await Connection.open(server.address, token=None)
    good = [await _episode(conn, task, seed, scripted, 3) for task in TASKS for seed in SEEDS]
    rand = [await _episode(conn, task, seed, random_clicker, 1) for task in TASKS for seed in SEEDS]
    # A bad action is an observation naming it; the episode goes on and can still be won.
    args = {"env": "miniwob", "chain_id": "bad"}
    await conn.call("acquire", args)
    await conn.call("reset", {**args, "row": {"task": "click-test", "seed": 9}})
    bad = await conn.call("step", {**args, "action": {"action": "click", "x": 500, "y": 1}})
    elements = json.loads((await conn.call("step", {**args, "action": {"query": "elements"}}))["observation"])
    won = await conn.call("step", {**args, "action": scripted("Click the button.", elements)})
    stats = await conn.call("stats")
    await conn.aclose()
    return good, rand, bad, won, stats

  with running_server("miniwob=1:1", options=("miniwob.expose_dom=true",)) as server:
    good, rand, bad, won, stats = trio.run(main)
  task_good, gui_good = [g[0] for g in good], [g[1] for g in good]
  task_rand, gui_rand = [r[0] for r in rand], [r[1] for r in rand]
  print(
    f"miniwob ({', '.join(TASKS)} x {len(SEEDS)} seeds): scripted task {np.mean(task_good):.3f} gui"
    f" {np.mean(gui_good):.3f}; random clicker task {np.mean(task_rand):.3f} gui {np.mean(gui_rand):.3f}"
  )
  assert task_good == [1.0] * len(good) and gui_good == [1.0] * len(good) and all(g[2] == 1 for g in good)
  assert np.mean(task_rand) < 0.3 and np.mean(gui_rand) < 0.4
  assert bad["info"]["error"] == "BadAction" and "'x' must be a number" in bad["observation"] and not bad["done"]
  assert won["done"] and won["reward"] == 1.0
  assert stats["pools"]["miniwob"]["crashes"] == 0 and stats["internal_errors"] == 0


@pytest.mark.slow
@needs_browser
def test_enter_text_by_click_type_and_keys_and_close_leaves_no_process_of_the_browser():
  env = MiniWoBEnv()
  env.start_blocking()
  try:
    obs = env.reset_blocking({"task": "click-button", "seed": 1})
    images.check_observation(obs)
    assert '"' in obs[0]["text"]  # Click on the "..." button.
    off = env.step_blocking({"query": "elements"})
    assert off.info["error"] == "BadAction" and "expose_dom" in off.observation
    with pytest.raises(ValueError, match="'task'"):
      env.reset_blocking({"task": "../etc/passwd"})
    # enter-text: click the field, type the name, Tab to Submit, Enter; the first action is the gold one.
    for typed, want in ((None, 1.0), ("Nobody", -1.0)):
      obs = env.reset_blocking({"task": "enter-text", "seed": 4, "gold_actions": [{"action": "click", "css": "#tt"}]})
      name = re.search(r'Enter "(.*)" into', obs[0]["text"]).group(1)
      box = env.browser.driver.execute_script(
        "return Object.values(document.querySelector('#tt').getBoundingClientRect().toJSON());"
      )
      left, top, width, height = box[:4]
      outs = [
        env.step_blocking({"action": "click", "x": left + width / 2, "y": top + height / 2}),
        env.step_blocking(json.dumps({"action": "type", "text": typed or name})),
        env.step_blocking({"action": "key", "key": "Tab"}),
        env.step_blocking({"action": "key", "key": "Enter"}),
      ]
      assert [o.done for o in outs] == [False, False, False, True] and outs[-1].reward == want
      assert env.gui_action()["reward"] == 1.0 and env.task_reward()["reward"] == want
    profile, pids = env.browser.profile_dir, env.browser.pids()
    chromium = [p for p in pids if b"chromium" in open(f"/proc/{p}/cmdline", "rb").read()]
    assert len(chromium) >= 2 and processes_with(profile)  # the browser and its children carry the profile
  finally:
    env.close_blocking()
  assert processes_with(profile) == [] and not os.path.exists(profile)
  assert not [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X")]


def _state(pid: int) -> str:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0]
  except OSError:
    return "X"
