"""How much of a judge's latency the rollout hides: a rollout's wall with a judge reward against the same rollout
with a rule reward (ratios measured in one process, variants interleaved).

  .venv/bin/python lab/bench/bench_judge.py [--rounds=3 --latency_s=0.3]

The chains: rows x chains, each one model turn whose sampler call takes a seeded random 0.5-2.0 s (a scripted
sampler: no model, so the machine's load barely matters); the judge: an OpenAI-compatible server on loopback that
answers after `latency_s`, reached through rewards/judge_client.JudgeCalls (the openai SDK). Variants:
  rule         exact_match inside each chain (the reference)
  judge_chain  the judge inside each chain as it finishes (rewards/judge.py: the calls overlap the other chains)
  judge_group  each row's chains ranked in one call when the row's last chain ends
  judge_after  the rule rollout, then every chain judged after it (what not overlapping costs)
The rollout is the only part of a training step a reward changes, so a step's ratio is at most the rollout's.
Writes lab/results/bench_judge.{json,md}.
"""

import datetime
import http.server
import json
import os
import statistics
import subprocess
import threading
import time

from absl import app, flags, logging

from bench_common import REPO_ROOT, RESULTS_DIR, cpu_name, load_note

_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved rounds of every variant.")
_LATENCY = flags.DEFINE_float("latency_s", 0.3, "The judge server's latency per request.")
_ROWS = flags.DEFINE_integer("rows", 8, "Rows per rollout.")
_CHAINS = flags.DEFINE_integer("chains", 8, "Chains per row.")
_OUT = flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_judge"), "Output stem (.json / .md).")


def judge_server(latency_s: float):
  """(server, base_url): replies {"scores": {"quality": 3}} or a ranking of every response, after latency_s."""

  class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
      pass

    def do_POST(self):
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      time.sleep(latency_s)
      user = body["messages"][-1]["content"]
      n = user.count("\nResponse ")
      text = json.dumps({"ranking": [str(i + 1) for i in range(n)]} if n else {"scores": {"quality": 3}})
      out = json.dumps(
        {
          "id": "x",
          "object": "chat.completion",
          "created": 0,
          "model": "judge",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
      ).encode()
      self.send_response(200)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(out)))
      self.end_headers()
      self.wfile.write(out)

  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
  server.daemon_threads = True
  threading.Thread(target=server.serve_forever, daemon=True).start()
  return server, f"http://127.0.0.1:{server.server_port}/v1"


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # (absl's INFO would print every HTTP request: CPU inside the timing)
  import numpy as np
  import trio

  from agentfly_jax.agents import ToolCallAgent, load_tokenizer, rollout
  from agentfly_jax.data import build_tiny_tokenizer
  from agentfly_jax.rewards import exact_match
  from agentfly_jax.rewards.judge import judge_reward
  from agentfly_jax.rewards.judge_client import JudgeCalls, OpenAIJudge
  from agentfly_jax.rewards.rubric import Criterion, Rubric
  from agentfly_jax.sampling.scripted import ScriptedSampler

  load0 = os.getloadavg()[0]
  tok_dir = build_tiny_tokenizer(
    "/tmp/bench_judge_tok", ["The answer is 42.", "What is the answer?"] * 8, vocab_size=300, template="qwen2.5"
  )
  tok = load_tokenizer(tok_dir)
  reply = tok.encode("The answer is 42.<|im_end|>")
  rng = np.random.default_rng(0)
  rows = [{"question": f"What is the answer {i}?", "answer": "42"} for i in range(_ROWS.value)]
  durations = rng.uniform(
    0.5, 2.0, size=997
  )  # by request seed (the rollout's, per row and chain): same in every variant

  class Sampler(ScriptedSampler):
    async def agenerate(self, prompt, params):
      await trio.sleep(float(durations[params.seed % len(durations)]))
      return await super().agenerate(prompt, params)

  server, url = judge_server(_LATENCY.value)
  rubric = Rubric((Criterion("quality", "how good the answer is"),), (1, 5))

  def calls():  # a fresh cache per rollout: every prediction is judged
    return JudgeCalls(OpenAIJudge(url, "judge"), max_concurrency=64)

  def run(reward_fn, after=None):
    agent = ToolCallAgent(tok_dir, tools=[], reward_fn=reward_fn, system_prompt="Answer.")

    async def go():
      trajs = await rollout(agent, rows, sampler=Sampler([reply]), num_chains=_CHAINS.value, max_turns=1, seed=0)
      if after is not None:
        async with trio.open_nursery() as n:
          for t in trajs:
            n.start_soon(after.compute, t.prediction, t.messages, t.row)
      return trajs

    start = time.perf_counter()
    trio.run(go)
    return time.perf_counter() - start

  variants = {
    "rule": lambda: run(exact_match),
    "judge_chain": lambda: run(judge_reward(calls(), rubric)),
    "judge_group": lambda: run(judge_reward(calls(), rubric, group=True)),
    "judge_after": lambda: run(exact_match, after=judge_reward(calls(), rubric)),
  }
  walls = {k: [] for k in variants}
  for _ in range(_ROUNDS.value):
    for name, fn in variants.items():
      walls[name].append(fn())
  server.shutdown()
  med = {k: statistics.median(v) for k, v in walls.items()}
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True)
  result = {
    "date": datetime.date.today().isoformat(),
    "commit": commit.stdout.strip(),
    "machine": f"{cpu_name()}; {load_note(load0)}",
    "rows": _ROWS.value,
    "chains": _CHAINS.value,
    "judge_latency_s": _LATENCY.value,
    "chain_s": "uniform 0.5-2.0 (seeded)",
    "rounds": _ROUNDS.value,
    "wall_s": walls,
    "median_s": med,
    "ratio_vs_rule": {k: med[k] / med["rule"] for k in med},
  }
  os.makedirs(os.path.dirname(_OUT.value), exist_ok=True)
  with open(_OUT.value + ".json", "w") as f:
    json.dump(result, f, indent=1)
  lines = [
    "# Judge latency behind the rollout",
    "",
    f"{result['date']}, commit {result['commit']}; {result['machine']}. {_ROWS.value} rows x {_CHAINS.value} chains,"
    f" one turn of 0.5-2.0 s each (scripted sampler), judge latency {_LATENCY.value} s on loopback, "
    f"{_ROUNDS.value} interleaved rounds (median). lab/bench/bench_judge.py.",
    "",
    "| variant | rollout wall s (median) | x rule |",
    "|---|---|---|",
  ]
  lines += [f"| {k} | {med[k]:.2f} | {result['ratio_vs_rule'][k]:.2f} |" for k in variants]
  with open(_OUT.value + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
