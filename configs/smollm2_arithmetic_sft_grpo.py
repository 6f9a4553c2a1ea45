"""SmolLM2-135M-Instruct learns to use the calculator: a short SFT on scripted demos, then GRPO.

  nice -n 5 .venv/bin/python experiments/train.py --config=configs/smollm2_arithmetic_sft_grpo.py \
      --workdir=runs/smol_sft_grpo

SmolLM2 makes no valid tool call on its own (lab/results/smollm2_tool_formats.md), so GRPO
alone sees reward 0 in every chain (zero advantages). The SFT phase (`sft.steps`) trains on the
task's scripted demos (tasks/arithmetic.py `scripted_response`): a calculator call then "The answer
is <result>." in a fraction `sft.tool_use_prob` of them, and "The answer is <guess>." (the guessed
number left out of the loss) in the rest. So SFT teaches the call format and reading the tool's
answer, and leaves the *decision* to call the tool mostly off: greedy success after SFT is low,
sampled rollouts call the tool sometimes (reward variance in most groups), and RL learns to call it.
metrics.jsonl step 0 holds the greedy held-out success before SFT (`eval_pre_sft/*`), after SFT
(`eval/*`) and the SFT NLL; results in lab/results/smollm2_arithmetic/.
Sizes for a 2-core CPU: 4 questions x 4 chains, two turns, task `arithmetic_brief` (the tool in
one line of the system prompt, no worked example: SFT teaches the format, and every training
step costs less than with the ~330-token hermes prompt + example of `arithmetic`;
lab/results/smollm2_arithmetic/README.md).
"""

from agentfly_jax.rl.config import config_beside


def get_config():
  c = config_beside(__file__, "smollm2_arithmetic_grpo.py")
  c.name = "smollm2_arithmetic_sft_grpo"
  c.task = "arithmetic_brief"  # the tool in one line, no worked example: ~106 prompt tokens, not ~330
  c.rollout.max_tokens_per_turn = 40
  c.rollout.max_total_tokens = 256
  c.sft.steps = 16
  c.sft.rows_per_step = 8
  c.sft.lr = 5e-5
  c.sft.tool_use_prob = 0.3
  c.train.steps = 10  # the recorded run (train.steps=60) was stopped after step 5: greedy 1.00 there
  c.train.lr = 2e-5
  c.train.micro_batch_size = 4  # activations ~0.35 GB per 200-token row (30 layers, no remat)
  c.eval.every = 5
  c.eval.num_rows = 24
  c.sft.cache_dir = "runs/sft_cache"  # the SFT'd params, reused by a rerun with the same config
  return c
