"""The `retrieval` env (bm25s over a JSONL corpus) on a real env server, the `retrieve` tool, and
the multi-hop acceptance: an oracle that queries each hop scores F1 >= 0.95 on the held-out
2-hop questions; answering without retrieving scores <= 0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import trio

from agentfly_jax.envs.manager import EnvManager
from agentfly_jax.rewards import f1
from agentfly_jax.tasks import multihop_qa
from agentfly_jax.tools import get_tool, retrieve
from envservers.envs import retrieval as retrieval_env
from envservers_helpers import running_server

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("bm25cache"))


@pytest.fixture(scope="module")
def server(cache_dir):
  with running_server("retrieval=8:2", options=(f"retrieval.cache_dir={cache_dir}",)) as s:
    yield s


def _write_corpus(path, docs):
  with open(path, "w") as f:
    for d in docs:
      f.write((d if isinstance(d, str) else json.dumps(d)) + "\n")


def test_oracle_scores_high_and_no_retrieval_low_through_the_server(server):
  rows = multihop_qa.test_rows()
  assert len(rows) >= 400 and {r["type"] for r in rows} == {"2-hop-bridge", "2-hop-comparison"}
  manager = EnvManager([server.address])

  async def main():
    scores = np.zeros(len(rows))
    next_row = iter(range(len(rows)))

    async def worker(chain: int):
      env = await manager.acquire("retrieval", f"oracle-{chain}")
      await env.reset(None)

      async def search(query):
        output = await retrieve.run({"query": query}, env=env)
        assert output.ok, output.observation
        return output.observation

      for i in next_row:
        scores[i] = f1(await multihop_qa.oracle_answer(rows[i], search), rows[i]["answer"])
      await manager.release("retrieval", f"oracle-{chain}")

    async with trio.open_nursery() as nursery:
      for chain in range(8):
        nursery.start_soon(worker, chain)
    return scores

  scores = trio.run(main)
  guessed = np.array([f1(multihop_qa.no_retrieval_answer(r), r["answer"]) for r in rows])
  assert scores.mean() >= 0.95, scores.mean()
  assert guessed.mean() <= 0.1, guessed.mean()
  # the bridge hop really is needed: the first passage does not contain the answer
  bridge = [r for r in rows if r["type"] == "2-hop-bridge"][:50]
  first = [
    retrieval_env.shared_index(retrieval_env.DEFAULT_CORPUS, None).search(r["hops"][0]["query"], 1)[0][0]["text"]
    for r in bridge
  ]
  assert sum(r["answer"][0] in text for r, text in zip(bridge, first)) <= 5


@pytest.mark.parametrize(
  "action, needle",
  [
    ("", "empty"),
    ("   ", "empty"),
    ({"query": ""}, "empty"),
    ({"query": "x", "k": 0}, "k must be"),
    ({"query": "x", "k": 500}, "k must be"),
    ({"query": "x", "k": "3"}, "k must be"),
    ("{not json", "does not parse"),
    ({"query": 7}, "must be a string"),
    (None, "must be a string"),
    ({"q": "Ostrevel"}, "unknown field"),
    ("x" * 5000, "too long"),
  ],
)
def test_bad_actions_get_informative_observations(server, action, needle):
  manager = EnvManager([server.address])

  async def main():
    env = await manager.acquire("retrieval", "bad")
    try:
      bad = await env.step(action)
      good = await env.step(json.dumps({"query": multihop_qa.test_rows()[0]["hops"][0]["query"], "k": 2}))
    finally:
      await manager.release("retrieval", "bad")
    return bad, good

  bad, good = trio.run(main)
  assert bad.observation.startswith("Error:") and needle in bad.observation, bad.observation
  assert good.observation.startswith("[1] ") and "[2] " in good.observation and "[3]" not in good.observation


def test_observation_lists_numbered_titled_passages_and_no_match_is_said():
  env = retrieval_env.RetrievalEnv()
  row = multihop_qa.test_rows()[0]
  out = trio.run(env.step, {"query": row["hops"][0]["query"], "k": 4})
  passages = multihop_qa.split_passages(out.observation)
  assert len(passages) == 4 == len(out.info["ids"])
  assert passages[0][0] == row["hops"][0]["query"]
  assert out.info["scores"] == sorted(out.info["scores"], reverse=True)
  assert trio.run(env.step, "zzqqxx unknownword").observation.startswith("No passage matches")


def test_index_is_shared_and_cached_on_disk_by_sha256(tmp_path):
  docs = [{"id": f"d{i}", "title": f"Title {i}", "text": f"word{i} common text {i % 7}"} for i in range(300)]
  corpus = tmp_path / "c.jsonl"
  _write_corpus(corpus, docs)
  cache = tmp_path / "cache"
  a = retrieval_env.RetrievalEnv(corpus=str(corpus), cache_dir=str(cache))
  b = retrieval_env.RetrievalEnv(corpus=str(corpus), cache_dir=str(cache), k=2)
  assert a.index is b.index and a.index.source == "built"
  sha = retrieval_env.corpus_sha256(str(corpus))
  assert (cache / sha / "meta.json").is_file()
  retrieval_env._indexes.clear()  # a "restart": the next construction loads the cache
  c = retrieval_env.RetrievalEnv(corpus=str(corpus), cache_dir=str(cache))
  assert c.index.source == "cache" and c.index.sha256 == sha
  assert [d["id"] for d, _ in c.index.search("word17 common", 3)] == [
    d["id"] for d, _ in a.index.search("word17 common", 3)
  ]
  assert a.index.search("word17", 1)[0][0]["id"] == "d17"


@pytest.mark.parametrize(
  "bad_line, needle",
  [
    ("{not json", "not valid JSON"),
    ('["a", "b"]', "expected a JSON object"),
    ('{"id": "x", "title": "t"}', "'text'"),
    ('{"id": 3, "title": "t", "text": "x"}', "'id'"),
    ('{"id": "d0", "title": "t", "text": "dup"}', "already used on line 1"),
  ],
)
def test_bad_corpus_line_stops_the_server_naming_file_and_line(tmp_path, bad_line, needle):
  corpus = tmp_path / "bad.jsonl"
  _write_corpus(
    corpus, [{"id": "d0", "title": "a", "text": "alpha"}, {"id": "d1", "title": "b", "text": "beta"}, bad_line]
  )
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "envservers",
      "--port",
      "0",
      "--env",
      "retrieval=2",
      "--env-opt",
      f"retrieval.corpus={corpus}",
      "--env-opt",
      f"retrieval.cache_dir={tmp_path}",
    ],
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 2, result
  assert f"{corpus}, line 3" in result.stderr and needle in result.stderr, result.stderr


def test_bad_options_are_refused():
  for options, needle in [
    ({"k": 0}, "'k'"),
    ({"max_k": 100}, "'max_k'"),
    ({"corpus": "/nonexistent.jsonl"}, "does not exist"),
  ]:
    with pytest.raises(ValueError, match=needle):
      retrieval_env.RetrievalEnv(**options)


def test_retrieval_env_imports_no_jax(tmp_path):
  code = (
    "import sys; from envservers.envs.retrieval import RetrievalEnv\n"
    f"env = RetrievalEnv(cache_dir={str(tmp_path)!r})\n"
    "assert env.index.search('Ostrevel city', 2)\n"
    "print([m for m in sys.modules if m.split('.')[0] in ('jax', 'agentfly_jax', 'numba')])"
  )
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert result.returncode == 0 and result.stdout.strip() == "[]", result


def test_one_off_retrieve_call_uses_the_embedded_local_server(tmp_path):
  row = multihop_qa.test_rows()[0]
  code = (
    "from agentfly_jax.tools import retrieve, get_tool\n"
    "assert get_tool('retrieve') is retrieve\n"
    f"print(retrieve({row['hops'][0]['query']!r}, k=2))"
  )
  env = dict(os.environ, AGENTFLY_LOCAL_ENVS="retrieval=2:1", AGENTFLY_CACHE_DIR=str(tmp_path))
  env.pop("AGENTFLY_ENV_SERVERS", None)
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
  assert result.returncode == 0, result
  assert result.stdout.startswith(f"[1] {row['hops'][0]['query']}\n") and "[2] " in result.stdout
  assert get_tool("retrieve") is retrieve
  assert retrieve.parameters["required"] == ["query"]


def test_scripted_demonstrations_follow_the_hops():
  import re

  index = retrieval_env.shared_index(retrieval_env.DEFAULT_CORPUS, None)
  rows = [r for r in multihop_qa.split_questions()["train"] if r["type"] != "1-hop"][:40]
  rng = np.random.default_rng(0)
  for row in rows:
    prompt = f"<|im_start|>user\n{row['question']}<|im_end|>\n"
    for _ in range(4):
      message = multihop_qa.scripted_response(prompt, True, rng)
      call = json.loads(re.search(r"<tool_call>\n(.*)\n</tool_call>", message).group(1))
      if call["name"] == "answer":
        break
      observation = retrieval_env.format_results(index.search(call["arguments"]["query"], 3))
      prompt += f"{message}\n<tool_response>\n{observation}\n</tool_response>\n"
    assert call["name"] == "answer" and f1(call["arguments"]["answer"], row["answer"]) == 1.0, row
  guess = multihop_qa.scripted_response(f"user\n{rows[0]['question']}\n", False, rng)
  assert '"answer"' in guess and "retrieve" not in guess
