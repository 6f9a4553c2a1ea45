"""The `gymnasium` env type hosts a text game from PyPI through a real env server: gym-bullet-chess
(chess against its random opponent; tests/gym_chess_text_env.py gives it the package's own UCI
text actions and text position): text opening, legal moves change the position, a move the space
refuses is named (the game goes on), an illegal move ends the game with the package's -1."""

from __future__ import annotations

import trio
from envservers_helpers import running_server

from agentfly_jax.envs.manager import EnvManager

GYM_ID = "tests.gym_chess_text_env:UCIChess-v0"


def _legal(observation: str) -> list[str]:
  return observation.split("Legal UCI moves: ")[1].split()


def test_a_pypi_text_game_through_the_server():
  with running_server("gymnasium=1") as server:

    async def main():
      manager = EnvManager([server.address])
      env = await manager.acquire("gymnasium", "chess")
      opening = await env.reset({"gym_id": GYM_ID, "seed": 0})
      results, observation = [], opening
      for _ in range(3):  # white's first legal move each turn; the random opponent answers
        results.append(await env.step(_legal(observation)[0]))
        observation = results[-1].observation
      refused = await env.step("zz")  # shorter than a UCI move: the Text space refuses it
      illegal = await env.step("e1e5")  # a UCI move the king cannot make
      ret = await env.compute_reward("return")
      await manager.release("gymnasium", "chess")
      await manager.aclose()
      return opening, results, refused, illegal, ret

    opening, results, refused, illegal, ret = trio.run(main)
  assert opening.startswith("FEN: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w") and "e2e4" in _legal(opening)
  assert all(r.reward == 0.0 and not r.done and "Turn: white" in r.observation for r in results)
  assert len({r.observation.split("\n")[0] for r in results}) == 3  # each move (and the reply) moved pieces
  assert refused.info["error"] == "BadAction" and not refused.done
  assert illegal.reward == -1.0 and illegal.done
  assert ret["reward"] == -1.0 and ret["steps"] == 4
