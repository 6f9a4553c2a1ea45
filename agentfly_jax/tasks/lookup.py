"""The demo task: answer a question whose answer only a tool observation holds.

'Find the code of key "ka-ro-mi".' — a key is three of 12 syllables (1,728 keys: 64 test, 64 dev,
1,600 train); its code is a fixed hash of the key into a 32-word list, so it cannot be guessed
(1/32) and the dev and test keys' codes are never seen in training: the policy must call
`lookup(key=...)`, read the observation ("The code is <word>."), and state it in its next turn
(multi-turn; learns only from its own tokens). Keys and observations are formatted so that copying
them is a token-for-token copy at fixed offsets (a key is always 5 tokens: syllable, '-', syllable,
'-', syllable). Why syllables, not words: with one word a key, a key of the dev or test split is a
token the warm start never wrote, and a tiny policy that practised the copy on the train keys only
copied 0 of 12 such keys into its call (40 train words; 11 % of dev rows right with 360 made-up
train words after 500 SFT steps); the earlier warm start copied them only because its SFT had seen
every key, the test keys included.

`scripted_response(prompt_text, use_tool, rng)` is the demonstration policy used for the SFT warm
start. It uses the tool only part of the time, so the warm-started policy mostly answers without
looking (its greedy answer is a guess) and RL has a decision to learn. A guessed answer word is a
`learn=False` piece (left out of the SFT loss, `rl/sft.py`): the warm start learns when to answer
and how to copy an observation, not a random word that would also pull on the copy.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np

from agentfly_jax.rewards import reward
from agentfly_jax.tools import tool

WORDS = (
  "apple",
  "river",
  "falcon",
  "stone",
  "tiger",
  "cloud",
  "maple",
  "ocean",
  "ember",
  "lotus",
  "raven",
  "cedar",
  "delta",
  "frost",
  "amber",
  "orbit",
  "pearl",
  "spark",
  "willow",
  "comet",
  "coral",
  "birch",
  "lemon",
  "cobra",
  "quartz",
  "sable",
  "tulip",
  "zebra",
  "nova",
  "harbor",
  "ivory",
  "meadow",
)

SYLLABLES = ("ka", "ro", "mi", "tu", "ne", "so", "pa", "li", "de", "fu", "ba", "zo")


def _all_keys() -> tuple[str, ...]:
  """Every key: three of the 12 syllables joined by '-' ("ka-ro-mi"): 1,728 keys."""
  return tuple(f"{a}-{b}-{c}" for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES)


KEYS = _all_keys()

SYSTEM_PROMPT = "Use the lookup tool to find codes."


def secret_code(key: str) -> str:
  """The code of a key: a fixed hash of the key into WORDS."""
  digest = hashlib.sha256(f"agentfly-lookup:{key}".encode()).digest()
  return WORDS[digest[0] % len(WORDS)]


@tool(name="lookup")
def lookup(key: str) -> str:
  """Looks up the secret code of a key.

  Args:
    key: the key, three syllables joined by '-' (e.g. "ka-ro-mi").
  """
  key = str(key).strip()
  if key not in KEYS:
    return f"Error: no such key {key!r}"
  return answer_text(secret_code(key))


def extract_answer(text: str | None) -> str:
  match = re.search(r"code is\s+([a-z]+)", text or "")
  return match.group(1) if match else ""


@reward(name="code_match")
def code_match(prediction: str, answer: str) -> dict:
  """1 if the final message states the right code, else 0."""
  got = extract_answer(prediction)
  return {"reward": float(got == answer), "answered": float(bool(got))}


def _split_keys() -> dict[str, tuple[str, ...]]:
  """The keys of each split: KEYS ordered by a fixed hash, 64 test, 64 dev, the other 1,600 train.
  A key's code is a fixed function of the key, so a policy could memorise the training keys'
  codes; the dev and test keys (and so their key -> code pairs) never occur in training, nor in the
  warm start's SFT demonstrations (make_rows). Every syllable occurs in the training keys at every
  place, so copying a new key is copying tokens the policy has written before."""
  order = sorted(KEYS, key=lambda k: hashlib.sha256(f"agentfly-lookup-split:{k}".encode()).hexdigest())
  return {"test": tuple(order[:64]), "dev": tuple(order[64:128]), "train": tuple(order[128:])}


SPLIT_KEYS = _split_keys()


def keys_fingerprint(*splits: str) -> str:
  """sha256 (16 hex) of the sorted keys of `splits`: names the keys a warm start's demos used."""
  keys = sorted(k for split in splits for k in SPLIT_KEYS[split])
  return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def _rows(n: int, seed: int, keys: tuple[str, ...]) -> list[dict]:
  rng = np.random.default_rng(seed)
  rows = []
  for i in rng.integers(len(keys), size=n):
    key = keys[int(i)]
    rows.append({"question": f'Find the code of key "{key}".', "key": key, "answer": secret_code(key)})
  return rows


def make_rows(n: int, seed: int) -> list[dict]:
  """n training rows {question, key, answer}; keys of the train split drawn with a seeded RNG."""
  return _rows(n, seed, SPLIT_KEYS["train"])


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """n dev rows (the eval during training; for choosing recipes): keys never in training."""
  return _rows(n, 999_983 + seed, SPLIT_KEYS["dev"])


def make_test_rows(n: int, seed: int) -> list[dict]:
  """n rows of the locked test split (keys in neither train nor dev): the final evaluation only."""
  return _rows(n, 7_000_001 + seed, SPLIT_KEYS["test"])


def tool_call_text(key: str) -> str:
  # Compact JSON except before the key: ` "` then occurs once in the call and once in the
  # question, right before the key, so copying the key is a plain induction copy.
  return f'<tool_call>\n{{"name":"lookup","arguments":{{"key": "{key}"}}}}\n</tool_call>'


def answer_text(word: str) -> str:
  return f"The code is {word}."


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator) -> str | list:
  """The demonstration policy's next assistant message, given the rendered prompt so far.

  First turn: a tool call (if use_tool) or a guessed answer, as pieces
  `[("The code is", True), (" <word>", False), (".", True)]` (the guess is not trained on);
  after a tool response: the answer copied from the observation.
  """
  last_user = prompt_text.rfind("code of key")
  after = prompt_text[last_user:]
  obs = re.findall(r"<tool_response>\s*The code is (\w+)\.\s*</tool_response>", after, flags=re.S)
  if obs:
    return answer_text(obs[-1].strip())
  key = re.search(r'code of key "([a-z-]+)"', after)
  if use_tool and key:
    return tool_call_text(key.group(1))
  guess = WORDS[int(rng.integers(len(WORDS)))]
  return [("The code is", True), (f" {guess}", False), (".", True)]


def tokenizer_corpus(n: int = 400, seed: int = 12345) -> list[str]:
  """Texts to train the task's tiny tokenizer on (questions, tool calls, observations, answers)."""
  texts = [SYSTEM_PROMPT] * 20 + ["<tool_response>\n", "\n</tool_response>"]
  for row in _rows(n, seed, SPLIT_KEYS["train"]):
    texts += [row["question"], tool_call_text(row["key"]), answer_text(row["answer"])]
  texts += [answer_text(w) for w in WORDS] * 4
  texts += [f'key "{k}"' for k in SPLIT_KEYS["train"]]
  return texts


TOOLS = (lookup,)
REWARD = code_match


def make_agent(tokenizer, tools=TOOLS, env_provider=None):
  """A ToolCallAgent whose system prompt describes the tool in one line instead of the
  template's full JSON schema block (keeps prompts ~50 tokens for the tiny CPU policy).
  `tools`: another tool named `lookup` (e.g. an env-bound one) with the same arguments;
  `env_provider`: the agent's EnvProvider for env-bound tools (default: the process-wide one)."""
  from agentfly_jax.agents import ToolCallAgent

  class CompactToolCallAgent(ToolCallAgent):
    def template_tools(self, tools):
      return None

  return CompactToolCallAgent(
    tokenizer, tools=list(tools), reward_fn=REWARD, system_prompt=SYSTEM_PROMPT, env_provider=env_provider
  )
