"""The multi-hop QA task: answer questions about a fictional knowledge base with `retrieve`.

Rows come from `multihop_kb.generate_kb(seed=0)` (the corpus the `retrieval` env serves by
default): train rows from the training split (1-hop and 2-hop), held-out rows from the test
split's 2-hop questions. Reward: SQuAD token F1 against the gold answer and its aliases (the
row's "answer" is that list). The model calls `retrieve(query, k)` and ends with `answer(...)`.

Scripted policies (used by the acceptance test and the SFT warm start):
  - `oracle_answer(row, search)`: queries the question's entity, reads the bridge entity (or the
    two years) out of the retrieved passage, queries again, and answers from what it read;
  - `no_retrieval_answer(row)`: the best guess without retrieving (the most frequent training
    answer of the question's type).
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import re

import numpy as np

from agentfly_jax.data import row_fields
from agentfly_jax.rewards.qa import f1
from agentfly_jax.tasks.multihop_kb import generate_kb, parse_passage
from agentfly_jax.tools.builtin import answer
from agentfly_jax.tools.retrieval import retrieve

SYSTEM_PROMPT = (
  "Answer the question using the retrieve tool to search a knowledge base; then call answer with a short answer."
)
TOOLS = (retrieve, answer)
REWARD = f1
# the gold answer, and the gold retrievals (each hop's query, the supporting passages): only the reward and
# the SFT demos read them
REWARD_ONLY_FIELDS = (*row_fields.REWARD_ONLY_FIELDS, "hops", "supporting_titles")
KB_SEED = 0


@functools.lru_cache(maxsize=1)
def knowledge_base():
  return generate_kb(seed=KB_SEED)


def _sample(rows: list[dict], n: int, seed: int) -> list[dict]:
  rng = np.random.default_rng(seed)
  return [dict(rows[int(i)]) for i in rng.integers(len(rows), size=n)]


def entity_split(name: str) -> str:
  """The split of a knowledge-base entity, by a fixed hash of its name: ~20 % test (locked), ~10 %
  dev, the rest train."""
  bucket = int(hashlib.sha256(f"agentfly-multihop-split:{name}".encode()).hexdigest()[:8], 16) % 10
  return {0: "test", 1: "test", 2: "dev"}.get(bucket, "train")


def row_entities(row: dict) -> tuple[str, ...]:
  """The entities a question's hops query: its entity and, for a bridge question, the bridge
  entity the first hop leads to; both compared entities of a comparison question."""
  if row["type"] == "2-hop-comparison":
    return tuple(h["query"] for h in row["hops"])
  if row["type"] == "2-hop-bridge":
    return (row["entity"], knowledge_base().entities[row["entity"]][row["hops"][0]["relation"]])
  return (row["entity"],)


@functools.lru_cache(maxsize=1)
def split_questions() -> dict[str, tuple[dict, ...]]:
  """The knowledge base's questions (both of its own splits) by the split of every entity they
  query: a row whose entities (both hops') all fall in one split belongs to it; a row mixing
  splits is left out. So no test (or dev) entity is ever queried by a train or dev (test) row."""
  out = {"train": [], "dev": [], "test": []}
  for rows in knowledge_base().questions.values():
    for row in rows:
      splits = {entity_split(e) for e in row_entities(row)}
      if len(splits) == 1:
        out[splits.pop()].append(row)
  return {k: tuple(v) for k, v in out.items()}


def make_rows(n: int, seed: int) -> list[dict]:
  """n training rows (1-hop and 2-hop questions of the train split), drawn with `seed`."""
  return _sample(split_questions()["train"], n, seed)


def test_rows(types: tuple[str, ...] = ("2-hop-bridge", "2-hop-comparison"), split: str = "test") -> list[dict]:
  """The `split`'s questions of `types` (their entities never queried in training)."""
  return [dict(r) for r in split_questions()[split] if r["type"] in types]


def make_eval_rows(n: int, seed: int) -> list[dict]:
  """The first n dev 2-hop questions (a fixed set: the same rows at every evaluation)."""
  del seed
  return test_rows(split="dev")[:n]


def make_test_rows(n: int, seed: int) -> list[dict]:
  """The first n 2-hop questions of the locked test split (the final evaluation only)."""
  del seed
  return test_rows(split="test")[:n]


# -- scripted policies ----------------------------------------------------------------------------

_PASSAGE = re.compile(r"^\[(\d+)\] (.*)$", re.M)


def split_passages(observation: str) -> list[tuple[str, str]]:
  """(title, text) of each numbered passage in a `retrieval` observation."""
  heads = list(_PASSAGE.finditer(observation))
  out = []
  for i, m in enumerate(heads):
    end = heads[i + 1].start() if i + 1 < len(heads) else len(observation)
    out.append((m.group(2).strip(), observation[m.end() : end].strip()))
  return out


def read_relation(observation: str, title: str, relation: str) -> str | None:
  """The value of `relation` in the retrieved passage titled `title` (None if it is not there)."""
  for passage_title, text in split_passages(observation):
    if passage_title == title:
      return parse_passage(text).get(relation)
  return None


async def oracle_answer(row: dict, search) -> str:
  """The answer a policy gets by issuing the right query per hop; `search(query) -> observation`
  (e.g. the `retrieve` tool bound to a chain's env)."""
  hops = row["hops"]
  if row["type"] == "2-hop-comparison":
    years = []
    for hop in hops:
      value = read_relation(await search(hop["query"]), hop["query"], hop["relation"])
      if value is None or not value.isdigit():
        return ""
      years.append(int(value))
    return str(abs(years[0] - years[1]))
  query = hops[0]["query"]
  value = None
  for hop in hops:
    value = read_relation(await search(query), query, hop["relation"])
    if value is None:
      return ""
    query = value
  return value


@functools.lru_cache(maxsize=1)
def _majority_answers() -> dict[str, str]:
  counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for row in split_questions()["train"]:
    counts[_question_kind(row)][row["answer"][0]] += 1
  return {kind: c.most_common(1)[0][0] for kind, c in counts.items()}


def _question_kind(row: dict) -> str:
  return json.dumps([row["type"], [h["relation"] for h in row["hops"]]])


def no_retrieval_answer(row: dict) -> str:
  """The most frequent training answer among questions of the same type and relations."""
  return _majority_answers().get(_question_kind(row), "")


# -- SFT demonstrations and the tiny tokenizer --------------------------------------------------


def tool_call_text(name: str, arguments: dict) -> str:
  return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@functools.lru_cache(maxsize=1)
def _train_rows_by_question() -> dict[str, dict]:
  return {r["question"]: r for r in split_questions()["train"]}


def scripted_response(prompt_text: str, use_tool: bool, rng: np.random.Generator) -> str:
  """The demonstration policy's next message: retrieve the entity named in the question, then
  the bridge entity read from the observation, then answer (guesses when `use_tool` is False)."""
  del rng
  rows = _train_rows_by_question()
  asked = [q.strip() for q in re.findall(r"[^\n>]*\?", prompt_text) if q.strip() in rows]
  row = rows[asked[-1]] if asked else None
  if row is None or not use_tool:
    return tool_call_text("answer", {"answer": no_retrieval_answer(row) if row else ""})
  responses = re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", prompt_text, flags=re.S)
  hops = row["hops"]
  if row["type"] == "2-hop-comparison":
    if len(responses) < len(hops):
      return tool_call_text("retrieve", {"query": hops[len(responses)]["query"]})
    years = [read_relation(obs, h["query"], h["relation"]) for obs, h in zip(responses, hops)]
    ok = all(y and y.isdigit() for y in years)
    return tool_call_text("answer", {"answer": str(abs(int(years[0]) - int(years[1]))) if ok else ""})
  query = hops[0]["query"]
  for obs, hop in zip(responses, hops):
    query = read_relation(obs, query, hop["relation"]) or ""
  if len(responses) < len(hops):
    return tool_call_text("retrieve", {"query": query})
  return tool_call_text("answer", {"answer": query})


def tokenizer_corpus(n: int = 400, seed: int = 12345) -> list[str]:
  """Texts for the task's tiny tokenizer: questions, answers, tool calls and passages."""
  kb = knowledge_base()
  texts = [SYSTEM_PROMPT] * 20 + ["<tool_response>\n", "\n</tool_response>"]
  for row in make_rows(n, seed):
    texts += [row["question"], row["answer"][0], tool_call_text("retrieve", {"query": row["hops"][0]["query"]})]
  texts += [p["text"] for p in kb.passages[:: max(1, len(kb.passages) // n)]]
  return texts


def make_agent(tokenizer):
  """A ToolCallAgent with retrieve + answer and the f1 reward."""
  from agentfly_jax.agents import ToolCallAgent

  return ToolCallAgent(tokenizer, tools=list(TOOLS), reward_fn=REWARD, system_prompt=SYSTEM_PROMPT)
