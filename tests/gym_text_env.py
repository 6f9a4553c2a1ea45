"""A Gymnasium environment with text observations and actions, registered on import (the
`gymnasium` env type reaches it as "tests.gym_text_env:WordGuess-v0"): guess a secret word; each
wrong guess tells how many letters are in the right place; a right guess gives reward 1."""

from __future__ import annotations

import gymnasium
from gymnasium import spaces

WORDS = ("amber", "cedar", "delta", "ember", "flint")


class WordGuessEnv(gymnasium.Env):
  def __init__(self, max_guesses: int = 6):
    self.observation_space = spaces.Text(max_length=200)
    self.action_space = spaces.Text(max_length=20)
    self.max_guesses, self.secret, self.guesses = max_guesses, WORDS[0], 0

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self.secret = WORDS[int(self.np_random.integers(len(WORDS)))]
    self.guesses = 0
    return f"Guess the 5-letter word; it is one of: {', '.join(WORDS)}.", {}

  def step(self, action: str):
    self.guesses += 1
    guess = action.strip().lower()
    if guess == self.secret:
      return "Right!", 1.0, True, False, {}
    same = sum(a == b for a, b in zip(guess, self.secret))
    return f"No: {same} letters in the right place.", 0.0, False, self.guesses >= self.max_guesses, {}


gymnasium.register(id="WordGuess-v0", entry_point=WordGuessEnv)
