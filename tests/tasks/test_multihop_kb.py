"""The generated multi-hop knowledge base: size, determinism, the shipped corpus, the split by
question entity, and that every gold answer can be read back from the passages."""

from __future__ import annotations

import collections
import gzip
import json
import re
import subprocess
import sys

import pytest

from agentfly_jax.tasks import multihop_kb, multihop_qa
from envservers.envs.retrieval import DEFAULT_CORPUS, load_corpus


@pytest.fixture(scope="module")
def kb():
  return multihop_qa.knowledge_base()


def test_size_types_and_unique_titles(kb):
  assert len(kb.passages) >= 5000
  titles = [p["title"] for p in kb.passages]
  assert len(set(titles)) == len(titles) and len({p["id"] for p in kb.passages}) == len(titles)
  kinds = collections.Counter(e["kind"] for e in kb.entities.values())
  assert set(kinds) == {"person", "city", "country", "org", "work", "invention"}
  for split in ("train", "test"):
    types = collections.Counter(r["type"] for r in kb.questions[split])
    assert set(types) == {"1-hop", "2-hop-bridge", "2-hop-comparison"}, types
    assert min(types.values()) >= 100
  for row in kb.questions["train"][:200]:
    assert isinstance(row["question"], str) and row["answer"] and all(isinstance(a, str) for a in row["answer"])


def test_deterministic_and_the_shipped_corpus_is_the_generated_one(kb):
  again = multihop_kb.generate_kb(seed=0)
  assert again.passages == kb.passages and again.questions == kb.questions
  assert load_corpus(DEFAULT_CORPUS) == kb.passages
  other = multihop_kb.generate_kb(seed=1)
  assert other.passages[0]["title"] != kb.passages[0]["title"]


def test_split_by_question_entity(kb):
  def entities(rows):
    names = set()
    for r in rows:
      names.add(r["entity"])
      if r["type"] == "2-hop-comparison":
        names.add(r["hops"][1]["query"])
    return names

  assert not entities(kb.questions["train"]) & entities(kb.questions["test"])


def test_every_answer_is_stated_in_its_supporting_passages(kb):
  by_title = {p["title"]: p["text"] for p in kb.passages}
  for row in kb.questions["test"]:
    texts = [by_title[t] for t in row["supporting_titles"]]
    if row["type"] == "2-hop-comparison":
      years = [int(multihop_kb.parse_passage(t)[h["relation"]]) for t, h in zip(texts, row["hops"])]
      assert str(abs(years[0] - years[1])) == row["answer"][0]
    else:
      stated = re.compile(rf"\b{re.escape(row['answer'][0])}\b")
      assert stated.search(texts[-1]), row
      if row["type"] == "2-hop-bridge":  # the bridge is needed: hop 1 does not state it
        assert not stated.search(texts[0]), row


def test_parse_passage_reads_back_every_relation(kb):
  for p in kb.passages[::7]:
    name = p["title"][4:] if p["id"].startswith("i") else p["title"]
    entity = kb.entities[name]
    read = multihop_kb.parse_passage(p["text"])
    assert read, p
    for key, value in read.items():
      assert str(entity["kind_of" if key == "kind" else key]) == value, (p, key)


def test_generator_script_writes_corpus_and_rows(tmp_path):
  result = subprocess.run(
    [sys.executable, "experiments/make_multihop_kb.py", f"--out_dir={tmp_path}", "--scale=0.2", "--seed=3"],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result
  corpus = load_corpus(str(tmp_path / "corpus.jsonl"))
  expected = multihop_kb.generate_kb(seed=3, scale=0.2)
  assert corpus == expected.passages
  rows = json.loads((tmp_path / "test.json").read_text())
  assert rows == expected.questions["test"] and all("question" in r for r in rows)
  with gzip.open(DEFAULT_CORPUS, "rt") as f:
    assert json.loads(f.readline()) == multihop_qa.knowledge_base().passages[0]
