"""SmolLM2-135M-Instruct learns to shop (WebShop reward; success = reward 1.0): a short SFT of LoRA
adapters on the scripted demos, then GRPO of the adapters; the base stays frozen.

  nice -n 5 .venv/bin/python experiments/train.py --config=configs/smollm2_webshop_sft_grpo.py \
      --workdir=runs/smol_webshop

Task `webshop_brief` (tasks/webshop_brief.py): the instructions, goals and purchase reward of
tasks/webshop.py on the `webshop` env server (embedded unless AGENTFLY_ENV_SERVERS names one), the
`shop` tool in one line of the system prompt and its pages without the repeated instruction, the
action list and results past the 5th. Held-out eval: 24 instructions from the eval seed, greedy.
The demos act on what the model sees: search the instruction's type + attributes, click the first
hit; if its page lacks an asked option value, go back and open the second (`LOOK_PAST` = 2); click
the asked values, buy. That plan succeeds on ~52 % of training instructions and 16 of the 24
held-out ones (the first hit alone: ~40 %). 40 % of the demos look past (`sft.tool_use_prob` 0.4), so
the look-past decision is left to RL; the SFT strength (30 steps at lr 1e-3) was chosen on validation rows
(training-split rows of their own seed), never the held-out ones.

The RL settings: 4 rows x 4 chains a step, a group's chains share their first two turns
(`rollout.shared_turns=2`: they contrast the first product page's decision, not the search), lr 1.5e-4,
token-mean aggregation (no per-chain length normalisation: short chains' tokens do not weigh more), 6 steps
(the sampled chains drift to the turn cap after). Every recipe tried, with its greedy held-out success
before and after RL, is in lab/results/smollm2_webshop/attempts/README.md; the seeds scored on the locked
test split in lab/results/LEARNING.md.

Memory on 24 GiB: the multi-turn prefix cache cuts a step's rollout time (each turn prefills only the
new page; lab/results/smollm2_webshop/attempts/README.md); micro-batches of 2 keep the update's peak low;
run the SFT (`--config.train.steps=0`, which saves the step-0 checkpoint) and the RL steps (the same command
with the steps, resuming) as two processes: one process holding both at 16 chains runs out of memory.
"""

from agentfly_jax.rl.config import config_beside


def get_config():
  c = config_beside(__file__, "smollm2_arithmetic_lora.py")
  c.name = "smollm2_webshop_sft_grpo"
  c.task = "webshop_brief"
  c.rollout.max_turns = 8  # search, hit, back, hit, 2 options, buy, done
  c.rollout.max_tokens_per_turn = 80  # an action is ~25 tokens greedy; at 40, 81 % of sampled chains were cut
  c.rollout.max_total_tokens = 1344  # the longest demo (two hits looked at) is ~1,250
  c.sft.steps = 30  # validation success 0.0 / 0.06 / 0.125 after 14 / 22 / 30 steps
  c.sft.rows_per_step = 8
  c.sft.lr = 1e-3
  c.sft.cache_dir = "runs/sft_cache"
  c.sft.tool_use_prob = 0.4
  c.rollout.rows_per_step = 4  # x 4 chains: 16 chains a step
  c.rollout.shared_turns = 2
  c.train.lr = 1.5e-4
  c.loss.agg = "token-mean"
  c.train.steps = 6
  c.eval.every = 6  # dev rows (make_eval_rows); the locked test split is read only by experiments/learning_report.py
  c.eval.num_rows = 24
  c.eval.before_sft = False  # the base model never calls the tool right (success 0.0); saves ~6 min
  # counted checkpoint, fixed before any run: the last step whose RL wall is within 60 min (+ ~30 min SFT = 90)
  c.eval.budget_minutes = 60.0
  c.checkpoint.every = 1
  c.rollout.prefix_cache_tokens = 16384  # ~0.75 GiB of keys / values at most (46 KB a token)
  c.train.micro_batch_size = 2
  return c
