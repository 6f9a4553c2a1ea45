"""Multi-hop QA, brief prompt, for a real small model: the rows, tools (`retrieve`, `answer`) and
F1 reward of tasks/multihop_qa.py, the tools listed one per line in the system prompt
(PromptedToolCallAgent format "brief", the hermes call syntax; SmolLM2's template ignores
`tools`), and demonstrations sized for a CPU (`retrieve` with k=1: the queried title is always the
top hit, so one ~50-token passage per observation instead of three).

The demo's decision is made once per question (`scripted_response`): with `use_tool` at the first
turn it retrieves the question's entity, then the bridge entity read from the passage (or the
second person of a comparison), then calls `answer` with what it read; without, it answers at once
in plain text ("Answer: <guess>", the most frequent training answer of the question's kind, the
guess left out of the SFT loss). Plain text, not the `answer` call: in GRPO the failing guesses'
negative advantage would otherwise push down the answer call that ends the retrieval chains too
(measured: a run whose guesses were `answer` calls went to retrieve-loops without answering).
So SFT teaches the call format, the copying of names from passages and the answer call, and
leaves the decision to retrieve partly off for RL (configs/smollm2_multihop_sft_grpo.py).

`make_two_hop_rows` draws the training rows of the 2-hop kinds only (task `multihop_qa_brief_2hop`,
tasks/multihop_qa_brief_2hop.py): the held-out split is 2-hop only, and on the mixed rows GRPO's
sampled reward came from the 1-hop questions (38 % of them), where one retrieval then an answer
is right (measured: the policy settled on that shortcut; lab/results/smollm2_multihop/).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from agentfly_jax.tasks.multihop_qa import (
  REWARD,
  REWARD_ONLY_FIELDS,  # noqa: F401
  SYSTEM_PROMPT,
  TOOLS,
  _sample,
  _train_rows_by_question,  # noqa: F401
  knowledge_base,
  make_eval_rows,
  make_rows,
  make_test_rows,  # noqa: F401
  no_retrieval_answer,
  read_relation,
  split_questions,
  tokenizer_corpus,
  tool_call_text,
)

TOOL_FORMAT = "brief"
RETRIEVE_K = 1
GUESS_PREFIX = "Answer: "
TWO_HOP_TYPES = ("2-hop-bridge", "2-hop-comparison")


@functools.lru_cache(maxsize=1)
def _two_hop_train_rows() -> tuple[dict, ...]:
  return tuple(r for r in split_questions()["train"] if r["type"] in TWO_HOP_TYPES)


def make_two_hop_rows(n: int, seed: int) -> list[dict]:
  """n training rows of the 2-hop kinds (`TWO_HOP_TYPES`) only, drawn with `seed` (the training
  split's 1-hop questions left out; the entities are still the training split's)."""
  return _sample(_two_hop_train_rows(), n, seed)


def _retrieve(query: str) -> str:
  return tool_call_text("retrieve", {"query": query, "k": RETRIEVE_K})


def _answer(text: str) -> str:
  return tool_call_text("answer", {"answer": text})


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator) -> str | list:
  """The demonstration's next assistant message for the conversation so far (`prompt_text`).

  `use_tool` is read at the first turn only (a conversation that has retrieved goes on to the
  end); comparison questions answer the difference of the two years read."""
  del rng
  rows = _train_rows_by_question()
  asked = [q.strip() for q in re.findall(r"[^\n>]*\?", prompt_text) if q.strip() in rows]
  if not asked:
    raise ValueError(f"multihop_qa_brief demo: no training question in the prompt: {prompt_text[-200:]!r}")
  row = rows[asked[-1]]
  after_question = prompt_text[prompt_text.rfind(row["question"]) :]  # the system prompt names the tags too
  responses = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", after_question, flags=re.S)
  if not responses and not use_tool:  # plain text: the answer call's tokens stay the retrieval path's
    return [(GUESS_PREFIX, True), (no_retrieval_answer(row), False)]
  hops = row["hops"]
  if row["type"] == "2-hop-comparison":
    if len(responses) < len(hops):
      return _retrieve(hops[len(responses)]["query"])
    years = [read_relation(obs, h["query"], h["relation"]) for obs, h in zip(responses, hops)]
    ok = all(y and y.isdigit() for y in years)
    return _answer(str(abs(int(years[0]) - int(years[1]))) if ok else "")
  query = hops[0]["query"]
  for obs, hop in zip(responses, hops):
    query = read_relation(obs, query, hop["relation"]) or ""
  if len(responses) < len(hops):
    return _retrieve(query)
  return _answer(query)


def make_agent(tokenizer):
  from agentfly_jax.agents.prompted import PromptedToolCallAgent

  return PromptedToolCallAgent(
    tokenizer, tools=list(TOOLS), reward_fn=REWARD, system_prompt=SYSTEM_PROMPT, tool_format=TOOL_FORMAT
  )
