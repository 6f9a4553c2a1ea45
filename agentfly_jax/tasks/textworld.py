"""TextWorld games: play a generated text adventure to its goal.

Rows: {"question", "game_seed", "game_kind", "difficulty", "split"} (or "game_file"); games are
generated on first use and cached (envservers.envs.textworld_games). Tools: `act` (one command)
and `admissible_commands`; reward: the score / max score of the episode (won games 1.0).
"""

from __future__ import annotations

import numpy as np

from agentfly_jax.envs.base import StepResult
from agentfly_jax.rewards import reward
from agentfly_jax.tasks.worlds import tool_call_text, world_agent
from agentfly_jax.tools import tool
from envservers.api import TEXTWORLD_DIFFICULTIES as DIFFICULTIES

ENV = "textworld"
TRAIN_KINDS = ("treasure_hunter", "coin_collector", "cooking")
SYSTEM_PROMPT = (
  "You play a text adventure. Send one command at a time with the act tool (e.g. "
  "go north, take key, open door); admissible_commands lists what you can do."
)


@tool(name="act", env=ENV)
async def act(command: str, env) -> StepResult:
  """Sends one command to the game.

  Args:
    command: e.g. "go east" or "take coin".
  """
  return await env.step(command)  # a StepResult: its `done` (the game over) ends the chain


@tool(name="admissible_commands", env=ENV)
async def admissible_commands(env) -> str:
  """Lists the commands the game accepts now."""
  return (await env.step({"query": "admissible_commands"})).observation


@reward(name="textworld_score", env=ENV)
async def score_reward(env) -> dict:
  """Score / max score of the episode (1.0 = won), with `won`."""
  return await env.compute_reward("score")


TOOLS = (act, admissible_commands)
# Typical game text, so that a tiny tokenizer trained for a random-init policy covers it.
SAMPLE_OBSERVATIONS = (
  "You are now playing a exciting session of TextWorld! Here is your task for today. First, "
  "it would be fantastic if you could attempt to venture east. After that, go to the south. "
  "With that done, pick-up the coin from the floor of the room.",
  "-= Vault =- Of every vault you could have shown up in, you had to saunter into an ordinary "
  "one. You begin to take stock of what's here. There is an unguarded exit to the east. You "
  "don't like doors? Why not try going south, that entranceway is unblocked.",
  "-= Kitchen =- You find yourself in a kitchen. You see a fridge, a counter, a stove and a "
  "table. You see a cookbook on the table. The fridge contains a red bell pepper.",
  "You can't go that way. That's not a verb I recognise. You pick up the key. Taken. "
  "Your score has just gone up by one point. *** The End *** You scored 1 out of a possible 1.",
)
REWARD = score_reward


def make_rows_split(n: int, seed: int, split: str, kinds=TRAIN_KINDS, difficulties=DIFFICULTIES) -> list[dict]:
  """n rows of (kind, difficulty, game seed); train and test seeds are disjoint (even / odd)."""
  rng = np.random.default_rng([seed, 31337])
  rows = []
  for _ in range(n):
    kind = kinds[int(rng.integers(len(kinds)))]
    difficulty = difficulties[int(rng.integers(len(difficulties)))]
    game_seed = 2 * int(rng.integers(2**29)) + (split != "train")
    rows.append(
      {
        "question": f"Play the {kind.replace('_', ' ')} game ({difficulty}) to the end.",
        "game_kind": kind,
        "difficulty": difficulty,
        "game_seed": game_seed,
        "split": split,
      }
    )
  return rows


def make_rows(n: int, seed: int) -> list[dict]:
  """Training rows. Only a few distinct games (games take seconds to generate): n rows over
  min(n, 8) games."""
  games = make_rows_split(min(n, 8), seed, "train", difficulties=("easy",))
  return [dict(games[i % len(games)]) for i in range(n)]


def make_eval_rows(n: int, seed: int) -> list[dict]:
  return make_rows_split(n, seed, "test", difficulties=("easy",))


def make_agent(tokenizer):
  return world_agent(tokenizer, TOOLS, REWARD, SYSTEM_PROMPT, ENV)


def tokenizer_corpus(n: int = 50, seed: int = 0) -> list[str]:
  texts = [SYSTEM_PROMPT] * 10
  for command in (
    "go north",
    "go south",
    "go east",
    "go west",
    "take coin",
    "open door",
    "look",
    "inventory",
    "examine cookbook",
    "prepare meal",
    "eat meal",
  ):
    texts += [tool_call_text("act", command=command)] * 3
  texts += [r["question"] for r in make_rows_split(n, seed, "train")]
  texts += list(SAMPLE_OBSERVATIONS) * 5
  return texts
