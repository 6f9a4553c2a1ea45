"""SmolLM2-135M-Instruct learns the calculator with LoRA: SFT of the adapters on scripted demos,
then GRPO of the adapters; the base stays frozen.

  nice -n 5 .venv/bin/python experiments/train.py --config=configs/smollm2_arithmetic_lora.py \
      --workdir=runs/smol_lora

configs/smollm2_arithmetic_sft_grpo.py (the full fine-tune; same task, sizes and schedule) with
`model.lora`: rank 16 adapters (alpha 32) on all seven projections of the 30 decoder layers
(4.9 M float32 params, 3.6 % of the 135 M base), so the optimizer holds adapters only, checkpoints
hold adapters + the base's sha256, and each weight sync moves the adapters only. LoRA wants a
larger learning rate than the full fine-tune (B starts at zero; PEFT recipes use ~1e-4 to 1e-3):
SFT 5e-4 and RL 2e-4 here, against 5e-5 and 2e-5 there. The KL reference (loss.kl_coef > 0)
would be the base + the adapters of RL step 0 (after SFT), with no copy of the base.
Recorded run (lab/results/smollm2_arithmetic_lora/, `--config.train.steps=5`): greedy
held-out success 0.0 before and after SFT, 0.625 after 5 GRPO steps (tool calls 1.0 per chain);
SFT NLL 1.176 -> 0.045; 18.6 MiB per weight sync.
Export the result for HF: `agentfly_jax.models.export_peft(model, folder)` or a merged HF folder
with `save_merged` (see WORKSPACE.md).
"""

from agentfly_jax.rl.config import config_beside


def get_config():
  c = config_beside(__file__, "smollm2_arithmetic_sft_grpo.py")
  c.name = "smollm2_arithmetic_lora"
  c.model.lora.rank = 16
  c.model.lora.alpha = 32.0
  c.model.lora.targets = "q,k,v,o,gate,up,down"
  c.sft.lr = 5e-4
  c.train.lr = 2e-4
  c.train.steps = 20
  return c
