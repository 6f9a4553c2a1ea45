"""An OpenEnv environment (openenv-core) for the `openenv` env type's tests: guess a number
between 1 and 20 from "higher" / "lower" hints; reward 1 on the right guess. `app` is its FastAPI
app (`uvicorn openenv_number_env:app`); `app_one` serves one session at a time."""

from __future__ import annotations

import random
import uuid

from openenv.core.env_server import Environment, create_app
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
  guess: str


class GuessObservation(Observation):
  message: str


RESETS: list = []  # the seed of every reset this server process ran (GET /resets reads it)


class NumberEnvironment(Environment):
  SUPPORTS_CONCURRENT_SESSIONS = True

  def __init__(self):
    super().__init__()
    self._state = State(episode_id=None, step_count=0)
    self.secret = 1

  def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
    RESETS.append(seed)
    self.secret = random.Random(seed).randint(1, 20)
    self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
    return GuessObservation(message="Guess a number from 1 to 20.", done=False, reward=0.0)

  def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
    self._state.step_count += 1
    try:
      guess = int(action.guess)
    except ValueError:
      return GuessObservation(message=f"{action.guess!r} is not a number.", done=False, reward=0.0)
    if guess == self.secret:
      return GuessObservation(message="Right!", done=True, reward=1.0)
    return GuessObservation(message="higher" if guess < self.secret else "lower", done=False, reward=0.0)

  @property
  def state(self) -> State:
    return self._state


app = create_app(NumberEnvironment, GuessAction, GuessObservation, env_name="number_guess", max_concurrent_envs=8)
app_one = create_app(NumberEnvironment, GuessAction, GuessObservation, env_name="number_guess", max_concurrent_envs=1)


@app.get("/resets")
def resets() -> list:
  """The seeds of the resets this server ran, in order (None: a reset without a seed)."""
  return RESETS
