"""WebShop, brief prompt, for a real small model: the rows, `shop` tool and purchase reward of
tasks/webshop.py, the one tool listed in one line of the system prompt (PromptedToolCallAgent
format "brief", the hermes call syntax; SmolLM2's template ignores `tools`), and a demonstration
policy that sees only what the model sees.

`expert_policy` (tasks/webshop.py) knows the goal product's title and pages to it; a policy
reading the page cannot. `scripted_response` acts on the instruction and the pages alone:
search[<product type> <attributes>] copied from the instruction, click the first result (of the 5
shown: `brief_page`); on its page, if an asked option value is not among the buttons, go back
(click[< prev]) and click the next result, up to `LOOK_PAST` hits; click each asked value the page
shows, buy. On this catalog the first hit often lacks an asked value, and looking past it to
later hits raises the success of a scripted search well above buying the first, at more tokens
(the shares, measured with the env's own search and reward: lab/results/smollm2_webshop/attempts/README.md).
The demo's decision is whether to look
past a first hit that lacks an asked value (`use_tool`, drawn at that page: `sft.tool_use_prob`);
it always picks the asked values a page shows, so a demo that does not look past buys the first
hit with what it offers (the ~38 % plan). With `tool_use_prob` < 1 the SFT'd policy is left unsure
at that one decision, and RL has a contrast to learn from there.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.webshop import (
  ENV,
  REWARD_ONLY_FIELDS,  # noqa: F401
  SYSTEM_PROMPT,
  catalog,
  expert_policy,  # noqa: F401
  make_eval_rows,
  make_rows,
  make_test_rows,  # noqa: F401
  tokenizer_corpus,
)
from agentfly_jax.tasks.worlds import tool_call_text
from agentfly_jax.tools import tool

TOOL_FORMAT = "brief"
RESULTS_SHOWN = 5
LOOK_PAST = 2  # the demo visits at most this many hits for one that shows every asked option value


def brief_page(observation: str) -> str:
  """A shop page without what the model already has: the instruction line (it is the question),
  the "Available actions" list (every button is on the page in brackets; search is offered on
  the search page only), and the results past the first `RESULTS_SHOWN`."""
  lines = [line for line in observation.split("\n") if not line.startswith("Instruction: ")]
  out, shown = [], 0
  for line in lines:
    if line.startswith("Available actions: ") and "search[<your query>]" not in line:
      continue
    if _RESULT.match(line):
      shown += 1
      if shown > RESULTS_SHOWN:
        continue
    out.append(line)
  return "\n".join(out)


@tool(name="shop", env=ENV)
async def shop(action: str, env) -> StepResult:
  """Acts in the web shop.

  Args:
    action: search[query] or click[button], e.g. click[buy now].
  """
  step = await env.step(action)  # a StepResult: its `done` (a purchase) ends the chain
  return dataclasses.replace(step, observation=brief_page(step.observation))


@reward(name="webshop_purchase", env=ENV)
async def purchase_reward(env) -> dict:
  """WebShop's reward of what the chain bought (0 if nothing), its parts, and `success`: 1.0 when
  the purchase matched everything (reward 1.0; the run's `eval/reward_metric/success`)."""
  parts = await env.compute_reward("purchase")
  return {**parts, "success": float(parts["reward"] >= 1.0 - 1e-9)}


TOOLS = (shop,)
REWARD = purchase_reward
_INSTRUCTION = re.compile(
  r"i need an? (?P<type>.+?)(?: that is (?P<attributes>.+?))?(?:, with (?P<options>.+?))?"
  r", and price lower than [\d.]+ dollars"
)
_OPTION = re.compile(r"(?:^|(?<= and ))([a-z0-9 ]+): (.+?)(?= and [a-z0-9 ]+: |$)")
_RESULT = re.compile(r"^\[(B0\w+)\] ", re.M)


def parse_instruction(text: str) -> dict | None:
  """{type, attributes (text), options: {name: value}} of a generated instruction, or None."""
  m = _INSTRUCTION.search(text)
  if m is None:
    return None
  return {
    "type": m.group("type"),
    "attributes": m.group("attributes") or "",
    "options": dict(_OPTION.findall(m.group("options") or "")),
  }


def lacks_asked_value(page: str, goal: dict) -> bool:
  """True when `page` is a product page (it has [Buy Now]) that does not show every option value
  `goal` (`parse_instruction`) asks for: the page the look-past demos go back from."""
  return "[Buy Now]" in page and any(f"[{v}]" not in page for v in goal["options"].values())


def _act(action: str) -> str:
  return tool_call_text("shop", action=action)


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator) -> str:
  """The demonstration's next shop action for the conversation so far (`prompt_text`); `use_tool`
  (go back past a first hit whose page lacks an asked value) is read on that page only; the asked
  values a page shows are always picked."""
  del rng
  m = _INSTRUCTION.search(prompt_text)
  if m is None:
    raise ValueError(f"webshop_brief demo: no instruction in the prompt: {prompt_text[-200:]!r}")
  goal = parse_instruction(m.group(0))
  conversation = prompt_text[m.start() :]  # the system prompt names the tags too
  pages = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", conversation, flags=re.S)
  page = pages[-1] if pages else conversation  # the first page comes with the question
  clicked = re.findall(r"click\[(B0\w+)\]", conversation)  # the hits visited, in order
  if page.startswith("Thank you for shopping"):  # a driver that does not end the chain at the purchase
    return "Done."
  if "search[<your query>]" in page:
    return _act(f"search[{' '.join(x for x in (goal['type'], goal['attributes']) if x)}]")
  if "[Buy Now]" in page:
    selected = set(re.findall(r"\[([^\]]+)\] \(selected\)", page))
    wanted = list(goal["options"].values())
    if use_tool and not selected and len(clicked) < LOOK_PAST and lacks_asked_value(page, goal):
      return _act("click[< prev]")
    for value in wanted:
      if value not in selected and f"[{value}]" in page:
        return _act(f"click[{value}]")
    return _act("click[buy now]")
  results = [r for r in _RESULT.findall(page) if r not in clicked]
  if results:
    return _act(f"click[{results[0]}]")
  return _act("click[back to search]")


def make_agent(tokenizer):
  """A PromptedToolCallAgent whose first user message is the instruction + the brief search page."""
  from agentfly_jax.agents.prompted import PromptedToolCallAgent

  class BriefShopAgent(PromptedToolCallAgent):
    def initial_messages(self, row, tools, first_observation=None):
      return super().initial_messages(row, tools, first_observation and brief_page(first_observation))

  return BriefShopAgent(
    tokenizer, tools=list(TOOLS), reward_fn=REWARD, system_prompt=SYSTEM_PROMPT, tool_format=TOOL_FORMAT, task_env=ENV
  )
