"""`miniwob`: MiniWoB++ tasks in a real headless Chromium, seen as screenshots, acted on with the mouse and
keyboard.

The pages are those the `miniwob` package ships (miniwob/html/miniwob/<task>.html, each a task page over
MiniWoB's core.js); its gymnasium env is not used. One Chromium per instance (envs/browser.py), started
with the instance and killed with it; a released instance keeps its browser for the next chain.

reset(row): row fields "task" (default: the option `task`), "seed" (int or str, MiniWoB's Math.seedrandom;
default 0) and optionally "gold_actions" (a list; its first item is what the GUI reward compares the first
action with; a reward-only field, data/row_fields.py). The page is loaded (once
per task), seeded, and an episode started as MiniWoB's own driver does (`core.startEpisodeReal()`), with
the episode clock at `episode_s`. The observation: a text part (the task's instruction and the action
forms) and the screenshot of the task area (160 x 210 CSS pixels, PNG; a point in it is a viewport point).

Actions (a JSON object, or its text):
  {"action": "click", "x": X, "y": Y}   a mouse click at (X, Y) of the screenshot
  {"action": "type", "text": "..."}     key presses into the focused element (at most 256 characters)
  {"action": "key", "key": "Enter"}     one named key (envs/browser.py KEYS)
A bad action is an observation naming what is wrong (the episode goes on). The episode ends when the
page ends it (MiniWoB's WOB_DONE_GLOBAL) or after `max_steps` actions. The step reward when it ends is the
task's raw reward (WOB_RAW_REWARD_GLOBAL, in [-1, 1], as the page's own code sets it; the time-scaled one,
WOB_REWARD_GLOBAL, is in info), 0.0 at the step limit.

Env rewards: `task` (the episode's raw task reward; 0 if it has not ended) and `gui_action`, AgentFly's
GUI reward for the episode's first action against the target: the action type matches and, for a click,
the point is inside the target element's box (measured when the episode starts), for `type` the text
matches (case and punctuation ignored), for `key` the key. The target is the row's `gold_actions[0]`
({"action": "click", "css": SELECTOR} | {"action": "type", "text": ...} | {"action": "key", "key": ...}) or, for
click-test, click-test-2 and click-button, the element the instruction names.

With the option `expose_dom=true` the action {"query": "elements"} returns the task area's visible
elements (tag, id, text, box) as JSON without acting: for scripted policies and checks; it is off by
default so an agent sees only pixels.

Options (`--env-opt miniwob.NAME=VALUE`): task (default click-test), max_steps (10), episode_s (60),
expose_dom (false), chromium / chromedriver (paths; default: found on PATH).
"""

from __future__ import annotations

import json
import pathlib
import re
import time
from typing import Any

from envservers import images
from envservers.env import BlockingEnv, EnvCrashed, StepOutcome, env_reward
from envservers.envs.browser import KEYS, Browser
from envservers.registry import register_env

TASK_BOX = (0, 0, 160, 210)  # MiniWoB's task area (#wrap) at the page's top left
WINDOW = (500, 420)  # headless window; its viewport holds the task area
MAX_TYPE_CHARS = 256
_TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
_ELEMENTS_JS = """
return Array.from(document.querySelectorAll('#wrap *')).filter(e => {
  const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0 && getComputedStyle(e).visibility !== 'hidden';
}).map(e => { const r = e.getBoundingClientRect();
  return {tag: e.tagName.toLowerCase(), id: e.id, text: (e.innerText || e.value || '').trim().slice(0, 80),
          box: [r.left, r.top, r.right, r.bottom]}; });
"""
# The element the instruction names, for tasks whose target is one element (a JS expression).
BUILT_IN_TARGETS = {
  "click-test": "document.querySelector('#subbtn')",
  "click-test-2": "Array.from(document.querySelectorAll('#area button')).find(b => "
  "core.getUtterance().includes(b.textContent.trim()))",
  "click-button": "Array.from(document.querySelectorAll('#area button')).find(b => "
  "b.textContent === (core.getUtterance().match(/\"(.*)\"/) || [])[1])",
}


def miniwob_pages() -> pathlib.Path:
  """The folder of MiniWoB++'s task pages inside the installed `miniwob` package."""
  import importlib.util

  spec = importlib.util.find_spec("miniwob")
  if spec is None or not spec.origin:
    raise RuntimeError("the miniwob package is not installed (requirements.txt / .ci/setup)")
  return pathlib.Path(spec.origin).parent / "html" / "miniwob"


def parse_action(action: Any) -> dict:
  """The action as {"action": click|type|key, ...}, checked; ValueError naming the field."""
  if isinstance(action, str):
    try:
      action = json.loads(action)
    except ValueError:
      raise ValueError(
        f"an action is a JSON object like {{\"action\": \"click\", \"x\": 10, \"y\": 20}}, got {action!r:.80}"
      )
  if not isinstance(action, dict):
    raise ValueError(f"an action is a JSON object, got {type(action).__name__}")
  kind = action.get("action")
  if kind == "click":
    for axis, limit in (("x", TASK_BOX[2]), ("y", TASK_BOX[3])):
      value = action.get(axis)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < limit:
        raise ValueError(f"click field {axis!r} must be a number in [0, {limit}), got {value!r}")
    return {"action": "click", "x": float(action["x"]), "y": float(action["y"])}
  if kind == "type":
    text = action.get("text")
    if not isinstance(text, str) or not 0 < len(text) <= MAX_TYPE_CHARS:
      raise ValueError(f"type field 'text' must be a string of 1-{MAX_TYPE_CHARS} characters, got {text!r:.80}")
    return {"action": "type", "text": text}
  if kind == "key":
    if action.get("key") not in KEYS:
      raise ValueError(f"key field 'key' must be one of {sorted(KEYS)}, got {action.get('key')!r}")
    return {"action": "key", "key": action["key"]}
  raise ValueError(f"field 'action' must be 'click', 'type' or 'key', got {kind!r}")


def _words(text: str) -> list[str]:
  return re.sub(r"[^\w\s]", "", text.lower()).split()


def gui_action_reward(action: dict | None, target: dict | None) -> dict:
  """AgentFly's GUI reward of one action against the target (module docstring): {reward, type_match, hit}."""
  if not action or not target:
    return {"reward": 0.0, "type_match": 0.0, "hit": 0.0}
  type_match = action["action"] == target["action"]
  hit = False
  if type_match and action["action"] == "click":
    left, top, right, bottom = target["box"]
    hit = left <= action["x"] < right and top <= action["y"] < bottom
  elif type_match and action["action"] == "type":
    hit = _words(action["text"]) == _words(target["text"])
  elif type_match:
    hit = action["key"] == target["key"]
  return {"reward": float(type_match and hit), "type_match": float(type_match), "hit": float(hit)}


@register_env
class MiniWoBEnv(BlockingEnv):
  name = "miniwob"
  call_timeout_s = 60.0

  def __init__(
    self,
    task: str = "click-test",
    max_steps: int = 10,
    episode_s: float = 60.0,
    expose_dom: bool = False,
    chromium: str = "",
    chromedriver: str = "",
  ):
    for field, value in (("max_steps", max_steps), ("episode_s", episode_s)):
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"miniwob option {field!r} must be a positive number, got {value!r}")
    if not isinstance(expose_dom, bool):
      raise ValueError(f"miniwob option 'expose_dom' must be true or false, got {expose_dom!r}")
    self.default_task = self._check_task(task, "option 'task'")
    self.max_steps, self.episode_s, self.expose_dom = int(max_steps), float(episode_s), expose_dom
    self.binaries = (chromium, chromedriver)
    self.browser: Browser | None = None
    self.page_task: str | None = None
    self._new_episode(None, None)

  def _new_episode(self, task: str | None, target: dict | None) -> None:
    self.task, self.target = task, target
    self.actions: list[dict] = []
    self.done, self.raw_reward, self.time_scaled = task is None, 0.0, 0.0

  @staticmethod
  def _check_task(task: Any, where: str) -> str:
    if not isinstance(task, str) or not _TASK_NAME.match(task) or not (miniwob_pages() / f"{task}.html").is_file():
      known = sorted(p.stem for p in miniwob_pages().glob("*.html"))
      raise ValueError(f"miniwob {where}: {task!r} is not a MiniWoB++ task; tasks: {', '.join(known[:12])}, ...")
    return task

  def start_blocking(self) -> None:
    self.browser = Browser.start(*WINDOW, *self.binaries)

  def alive(self) -> bool:
    return self.browser is not None and bool(self.browser.pids())

  def close_blocking(self) -> None:
    browser, self.browser = self.browser, None
    if browser is not None:
      browser.close()

  # -- episodes -------------------------------------------------------------------------------------

  def reset_blocking(self, row: dict | None):
    row = row or {}
    task = self._check_task(row.get("task", self.default_task), "row field 'task'")
    seed = row.get("seed", 0)
    if not isinstance(seed, (int, str)) or isinstance(seed, bool):
      raise ValueError(f"miniwob row field 'seed' must be an int or a string, got {seed!r}")
    driver = self._driver()
    if task != self.page_task:
      self.page_task = None
      driver.get((miniwob_pages() / f"{task}.html").as_uri())
      width, height = driver.execute_script("return [window.innerWidth, window.innerHeight];")
      if width < TASK_BOX[2] or height < TASK_BOX[3]:
        raise EnvCrashed(f"miniwob: the browser's viewport is {width}x{height}, smaller than the task area")
      self.page_task = task
    driver.execute_script(
      f"Math.seedrandom({json.dumps(seed)}); core.EPISODE_MAX_TIME = {int(self.episode_s * 1000)};"
      " core.startEpisodeReal();"
    )
    deadline = time.monotonic() + 5.0
    while not driver.execute_script("return WOB_TASK_READY;"):
      if time.monotonic() > deadline:
        raise RuntimeError(f"miniwob task {task!r} did not become ready within 5 s")
      time.sleep(0.05)
    self._new_episode(task, self._measure_target(task, row.get("gold_actions")))
    return self._observation()

  def _driver(self):
    if self.browser is None:
      raise EnvCrashed("miniwob: the instance has no browser")
    return self.browser.driver

  def _measure_target(self, task: str, gold_actions: Any) -> dict | None:
    """The GUI reward's target (the row's first gold action, else the task's built-in one), with a click
    target's box measured now (before any action)."""
    if gold_actions is not None and (not isinstance(gold_actions, list) or not gold_actions):
      raise ValueError("miniwob row field 'gold_actions' must be a non-empty list of actions")
    target = gold_actions[0] if gold_actions else None
    if target is None:
      if task not in BUILT_IN_TARGETS:
        return None
      target, expression = {"action": "click"}, BUILT_IN_TARGETS[task]
    else:
      if not isinstance(target, dict) or target.get("action") not in ("click", "type", "key"):
        raise ValueError("miniwob row field 'gold_actions[0]' must be {'action': 'click'|'type'|'key', ...}")
      if target["action"] != "click":
        return dict(target)
      if not isinstance(target.get("css"), str):
        raise ValueError("miniwob row field 'gold_actions[0].css' (a CSS selector) is needed for a click target")
      expression = f"document.querySelector({json.dumps(target['css'])})"
    box = self._driver().execute_script(
      f"const e = {expression}; if (!e) return null; const r = e.getBoundingClientRect();"
      " return [r.left, r.top, r.right, r.bottom];"
    )
    if box is None:
      raise ValueError(f"miniwob task {task!r}: the target element is not on the page")
    return {"action": "click", "box": [float(v) for v in box]}

  def _instruction(self) -> str:
    response = self._driver().execute_script("return core.getUtterance();")
    return response["utterance"] if isinstance(response, dict) else str(response)

  def _observation(self) -> list[dict]:
    text = (
      f"Task: {self._instruction()}\n"
      f"The screenshot is {TASK_BOX[2]}x{TASK_BOX[3]} pixels. Act with one JSON object: "
      '{"action": "click", "x": X, "y": Y}, {"action": "type", "text": "..."} or {"action": "key", "key": "Enter"}.'
    )
    return [images.text_part(text), images.image_part(self.browser.screenshot_png(TASK_BOX))]

  def _metadata(self) -> dict:
    return self._driver().execute_script(
      "return {done: WOB_DONE_GLOBAL, reward: WOB_REWARD_GLOBAL, raw: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON};"
    )

  def step_blocking(self, action: Any) -> StepOutcome:
    if isinstance(action, dict) and "query" in action:
      return self._query(action)
    if self.task is None or self.done:
      return StepOutcome("Error: the episode is over (or was never reset).", done=True, info={"error": "EpisodeOver"})
    try:
      act = parse_action(action)
    except ValueError as e:
      return StepOutcome(f"Error: {e}", info={"error": "BadAction"})
    if act["action"] == "click":
      self.browser.click(act["x"], act["y"])
    elif act["action"] == "type":
      self.browser.type_text(act["text"])
    else:
      self.browser.press(act["key"])
    self.actions.append(act)
    meta = self._metadata()
    if meta["done"]:
      self.done, self.raw_reward, self.time_scaled = True, float(meta["raw"]), float(meta["reward"])
      info = {"time_scaled_reward": self.time_scaled, "reason": meta["reason"], "task": self.task}
      return StepOutcome(f"The task ended with reward {self.raw_reward:g}.", self.raw_reward, True, info)
    if len(self.actions) >= self.max_steps:
      self.done = True
      return StepOutcome(f"The step limit ({self.max_steps}) is reached.", 0.0, True, {"truncated": True})
    return StepOutcome(self._observation(), None, False, {})

  def _query(self, action: dict) -> StepOutcome:
    if not self.expose_dom:
      return StepOutcome("Error: DOM queries are off (option miniwob.expose_dom)", info={"error": "BadAction"})
    if action["query"] != "elements":
      return StepOutcome(f"Error: unknown query {action['query']!r}; queries: elements", info={"error": "BadAction"})
    return StepOutcome(json.dumps(self._driver().execute_script(_ELEMENTS_JS)), info={"query": True})

  @env_reward("task")
  def task_reward(self) -> dict:
    """The episode's raw task reward (0 until the page ends the episode), with the time-scaled one."""
    return {"reward": self.raw_reward, "time_scaled": self.time_scaled, "done": float(self.done)}

  @env_reward("gui_action")
  def gui_action(self) -> dict:
    """AgentFly's GUI reward of the episode's first action against the target (module docstring)."""
    return gui_action_reward(self.actions[0] if self.actions else None, self.target)
