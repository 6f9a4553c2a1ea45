"""A rollout end to end: define a tool and a reward, build a tiny random-init model + the JAX
sampler, run multi-chain multi-turn rollouts, print a trajectory with its action mask.

  .venv/bin/python experiments/rollout_example.py [--num_chains=4 --max_turns=3 --nocolor]

No hub needed: the tokenizer is trained here and the model is random, so its text is noise and
chains end on the token budget or without a tool call. A second rollout with a scripted sampler
(fixed replies) shows the multi-turn structure: model turns highlighted, tool observations and
template text appended between them, the finish tool ending the chain, the reward.
"""

import os
import sys
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

_NUM_CHAINS = flags.DEFINE_integer("num_chains", 4, "Chains per question.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 3, "Model turns per chain.")
_MAX_TOKENS_PER_TURN = flags.DEFINE_integer("max_tokens_per_turn", 48, "Generated tokens per turn.")
_TEMPLATE = flags.DEFINE_enum("template", "qwen2.5", ["qwen2.5", "llama3"], "Chat template style.")
_COLOR = flags.DEFINE_bool("color", True, "ANSI colours (else model text is in ⟦ ⟧ brackets).")
_SEED = flags.DEFINE_integer("seed", 0, "Model init and sampling seed.")

QUESTIONS = [
  {"question": "How many letters does the word 'rollout' have?", "word": "rollout"},
  {"question": "How many letters does the word 'agent' have?", "word": "agent"},
]


def main(argv):
  del argv
  from flax import nnx

  from agentfly_jax import reward, tool
  from agentfly_jax.agents import ToolCallAgent, pad_batch, run_rollout
  from agentfly_jax.agents.display import format_trajectory
  from agentfly_jax.data import build_tiny_tokenizer
  from agentfly_jax.models import CausalLM, tiny_config
  from agentfly_jax.sampling import JaxSampler, SamplingParams
  from agentfly_jax.sampling.scripted import ScriptedSampler
  from agentfly_jax.tools import answer

  # 1. A tool and a reward, as a user writes them.
  @tool
  def count_letters(word: str) -> int:
    """Counts the letters of a word.

    Args:
      word: the word to count.
    """
    return sum(c.isalpha() for c in word)

  @reward
  def correct_count(prediction, word) -> dict:
    ok = prediction is not None and prediction.strip() == str(len(word))
    return {"reward": float(ok), "answered": float(prediction is not None)}

  # 2. Tokenizer, tiny model, JAX sampler.
  workdir = tempfile.mkdtemp(prefix="rollout_example_")
  corpus = [q["question"] for q in QUESTIONS] + ["The word has 7 letters.", "count_letters"] * 5
  tok_dir = build_tiny_tokenizer(os.path.join(workdir, "tokenizer"), corpus, vocab_size=512, template=_TEMPLATE.value)
  agent = ToolCallAgent(
    tok_dir,
    tools=[count_letters, answer],
    reward_fn=correct_count,
    system_prompt="Count letters with the tool, then answer.",
  )
  vocab = agent.tokenizer.vocab_size
  model = CausalLM(tiny_config("qwen2", vocab_size=vocab), rngs=nnx.Rngs(_SEED.value))
  sampler = JaxSampler(model, agent.tokenizer, max_batch_size=8, max_len=2048, seed=_SEED.value)
  params = SamplingParams(temperature=1.0, top_p=0.95)

  start = time.perf_counter()
  trajectories = run_rollout(
    agent,
    QUESTIONS,
    sampler=sampler,
    num_chains=_NUM_CHAINS.value,
    max_turns=_MAX_TURNS.value,
    sampling_params=params,
    max_tokens_per_turn=_MAX_TOKENS_PER_TURN.value,
    max_total_tokens=1536,
    seed=_SEED.value,
  )
  elapsed = time.perf_counter() - start
  batch = pad_batch(trajectories, pad_id=agent.tokenizer.pad_token_id)
  print(
    f"== JAX sampler, random tiny model: {len(trajectories)} chains in {elapsed:.1f} s "
    f"(incl. compilation); batch arrays "
    f"{ {k: v.shape for k, v in batch.items()} }"
  )
  print(f"finish reasons: {[t.finish_reason for t in trajectories]}")
  print(format_trajectory(trajectories[0], agent.tokenizer, color=_COLOR.value))

  # 3. The same agent with scripted replies, to show a full multi-turn chain.
  tok = agent.tokenizer
  eot = agent.end_of_turn_text.strip() or tok.special_tokens.get("eos_token", "")
  replies = [
    '<tool_call>\n{"name": "count_letters", "arguments": {"word": "rollout"}}\n</tool_call>',
    '<tool_call>\n{"name": "answer", "arguments": {"answer": "7"}}\n</tool_call>',
  ]

  def script(prompt_ids):
    turn = tok.decode(prompt_ids).count("count_letters\", \"arguments") > 0
    return tok.encode(replies[int(turn)] + eot)

  [scripted] = run_rollout(agent, QUESTIONS[:1], sampler=ScriptedSampler(script), max_turns=4)
  print("\n== Scripted sampler (fixed replies), same agent, tool and reward:")
  print(format_trajectory(scripted, tok, color=_COLOR.value))
  print(
    f"prediction {scripted.prediction!r}, reward {scripted.reward}, metrics "
    f"{scripted.reward_metrics}, tool calls {scripted.tool_calls}"
  )


if __name__ == "__main__":
  app.run(main)
