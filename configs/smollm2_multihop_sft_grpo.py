"""SmolLM2-135M-Instruct learns multi-hop retrieval (search -> read -> answer, F1 reward): a short
SFT of LoRA adapters on the scripted demos, then GRPO of the adapters; the base stays frozen.

  nice -n 5 .venv/bin/python experiments/train.py --config=configs/smollm2_multihop_sft_grpo.py \
      --workdir=runs/smol_multihop

Task `multihop_qa_brief` (tasks/multihop_qa_brief.py): the questions, the `retrieve` tool (BM25 on
the `retrieval` env server, embedded unless AGENTFLY_ENV_SERVERS names one) and the `answer` tool
of tasks/multihop_qa.py, the tools in one line each of the system prompt. Held-out eval: the
first 24 2-hop questions of the test split (entities never asked about in training; 20 bridge,
4 comparison), greedy. The recipe of configs/smollm2_arithmetic_lora.py: SFT teaches the call
format and copying names out of passages on demos that retrieve in a fraction
`sft.tool_use_prob` of the questions (the rest answer a guess, left out of the loss), so the
decision to retrieve stays partly off and RL has reward variance to learn it from.
Results: lab/results/smollm2_multihop/ (lab/report_sft_rl_run.py).
"""

from agentfly_jax.rl.config import config_beside


def get_config():
  c = config_beside(__file__, "smollm2_arithmetic_lora.py")
  c.name = "smollm2_multihop_sft_grpo"
  c.task = "multihop_qa_brief"
  c.rollout.max_turns = 4  # retrieve, retrieve, answer (+1 spare)
  c.rollout.max_tokens_per_turn = 40  # a call is ~25 tokens
  c.rollout.max_total_tokens = 512  # a full 2-hop chain is ~420
  c.sft.steps = 24  # 16 x 8 demos at 0.3 left the copying too weak: no reward at T=1
  c.sft.rows_per_step = 8
  c.sft.tool_use_prob = 0.4
  c.sft.cache_dir = "runs/sft_cache"
  c.train.lr = 1e-4  # 2e-4 (the arithmetic LoRA's) moved the policy to retrieve-loops in one step
  c.train.steps = 8
  c.eval.every = 4
  c.eval.num_rows = 24
  c.checkpoint.every = 4
  return c
