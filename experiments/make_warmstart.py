"""Build the lookup task's warm-start policy: tiny tokenizer + random-init model + SFT on
scripted demonstrations, saved as an HF folder (config.json, model.safetensors, tokenizer files).

  .venv/bin/python experiments/make_warmstart.py --out=experiments/results/lookup_warmstart
  .venv/bin/python experiments/make_warmstart.py --family=qwen3_moe --num_experts=4 --experts_per_tok=2 \
    --moe_intermediate=128 --out=experiments/results/lookup_warmstart_moe

The second is a mixture-of-experts policy (Qwen3-MoE) whose active MLP width equals the dense one's
(2 experts x 128 = 256) and is otherwise the same (tokenizer, recipe, rows).

Two SFT phases: `--copy_steps` on demonstrations that always use the tool (the tiny policy learns
to copy the key into the call and the code out of the observation), then `--prior_steps` on
demonstrations that use the tool only `--tool_use_prob` of the time, so the warm-started policy
mostly answers without looking: its *greedy* first move is a guess (held-out greedy success
<= 0.5) and RL has a decision to learn. The guessed word itself is left out of the SFT loss (a
`learn=False` piece of `tasks/lookup.scripted_response`), so the prior phase teaches when to
answer, not a word, and does not pull on the copy. Greedy and sampled (T=1) held-out success are
printed along the way and saved in warmstart.json. The demonstrations' rows are the task's
`make_rows`: train keys only (warmstart.json records the fingerprints of the keys used and left out;
tests/tasks/test_locked_splits.py checks them against the task's split). The folder is shipped in the repo
so the demo and the CI learning test start from it in seconds (`configs/lookup_*.py` point
`model.pretrained` at it).
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # noqa: E402

_OUT = flags.DEFINE_string("out", "experiments/results/lookup_warmstart", "Output HF folder.")
_COPY_STEPS = flags.DEFINE_integer("copy_steps", 800, "SFT steps on always-tool demonstrations.")
_PRIOR_STEPS = flags.DEFINE_integer("prior_steps", 150, "SFT steps on mixed demonstrations.")
_TOOL_USE_PROB = flags.DEFINE_float("tool_use_prob", 0.3, "Tool use rate of the mixed demonstrations.")
_BATCH = flags.DEFINE_integer("batch", 32, "Demonstrations per SFT step.")
_LR = flags.DEFINE_float(
  "lr",
  1e-3,
  "SFT learning rate of the copy phase (at 3e-3 the answer turn never learned to copy the observed code: "
  "1,100 steps at chance; at 1e-3 it did by step 350).",
)
_PRIOR_LR = flags.DEFINE_float(
  "prior_lr",
  0.0,
  "> 0: the prior phase gets a fresh optimizer with this learning "
  "rate; 0 (the shipped recipe): it continues the copy phase's optimizer.",
)
_INIT = flags.DEFINE_string("init", "", "Start from this HF folder (model + tokenizer) instead of a random init.")
_FIRST_STEP = flags.DEFINE_integer(
  "first_step",
  0,
  "Step number to start counting at (seeds the demo rows; give the init's step count when continuing from --init).",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed.")
_LAYERS = flags.DEFINE_integer("layers", 2, "Decoder layers.")
_HIDDEN = flags.DEFINE_integer("hidden", 128, "Hidden size.")
_HEADS = flags.DEFINE_integer("heads", 4, "Attention heads.")
_KV_HEADS = flags.DEFINE_integer("kv_heads", 2, "KV heads.")
_HEAD_DIM = flags.DEFINE_integer("head_dim", 32, "Head dim (vLLM on CPU needs >= 32).")
_FAMILY = flags.DEFINE_string("family", "qwen2", "Model family of the random init (qwen2 | qwen3 | qwen3_moe ...).")
_NUM_EXPERTS = flags.DEFINE_integer("num_experts", 4, "qwen3_moe: experts per layer.")
_EXPERTS_PER_TOK = flags.DEFINE_integer("experts_per_tok", 2, "qwen3_moe: experts each token is routed to (top k).")
_MOE_INTERMEDIATE = flags.DEFINE_integer(
  "moe_intermediate", 128, "qwen3_moe: each expert's width (experts_per_tok x this = the dense model's 2 x hidden)."
)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  import json
  from flax import nnx
  from agentfly_jax.models import save_pretrained
  from agentfly_jax.rl.batching import rollout_metrics
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.rl.sft import ScriptedPolicySampler
  from agentfly_jax.rl.core.train_state import make_optimizer
  from agentfly_jax.rl.sft_cache import sft_program
  from agentfly_jax.rl.trainer import Trainer
  from agentfly_jax.tasks import lookup

  c = default_config()
  c.seed = _SEED.value
  c.eval.num_rows = 64
  c.model.num_layers, c.model.hidden_size = _LAYERS.value, _HIDDEN.value
  c.model.num_heads, c.model.num_kv_heads, c.model.head_dim = _HEADS.value, _KV_HEADS.value, _HEAD_DIM.value
  c.model.intermediate_size = 2 * _HIDDEN.value
  c.model.family = _FAMILY.value
  c.model.num_experts, c.model.num_experts_per_tok = _NUM_EXPERTS.value, _EXPERTS_PER_TOK.value
  c.model.moe_intermediate_size = _MOE_INTERMEDIATE.value
  c.log.progress = False
  c.model.pretrained = os.path.abspath(_INIT.value) if _INIT.value else ""
  workdir = os.path.abspath(_OUT.value) + ".work"
  c.train.micro_batch_size = _BATCH.value  # one SFT step = one micro-batch, as before
  tr = Trainer(c, workdir)
  params = tr.run.parts.policy.params
  t0 = time.time()
  step = _FIRST_STEP.value
  last = step + _COPY_STEPS.value + _PRIOR_STEPS.value
  greedy = sampled = None
  program = state = None
  for phase, steps, p_tool, lr in [
    ("copy", _COPY_STEPS.value, 1.0, _LR.value),
    ("prior", _PRIOR_STEPS.value, _TOOL_USE_PROB.value, _PRIOR_LR.value),
  ]:
    if not steps:
      continue
    if program is None or lr > 0:  # --prior_lr=0: the prior phase continues the copy phase's optimizer
      program = sft_program(tr.run, make_optimizer(lr=lr or _LR.value, max_grad_norm=1.0, warmup_steps=10))
      state = program.new_state(params)
    demo = ScriptedPolicySampler(
      tr.run.parts.tokenizer,
      lambda text, rng, p=p_tool: tr.run.parts.task.scripted_response(text, rng.random() < p, rng),
      tr.run.parts.end_of_turn_id,
      seed=c.seed,
    )
    for _ in range(steps):
      rows = tr.run.parts.task.make_rows(_BATCH.value, seed=20_000_000 + step)
      trajs = tr.rollout(rows, sampler=demo, num_chains=1, seed=step)
      state, m = program.step(state, trajs, demo)
      step += 1
      if step % 25 == 0:
        print(f"{phase} step {step}: nll {float(m['sft/nll']):.3f} ({time.time() - t0:.0f}s)", flush=True)
      if step % 50 == 0 or step == last:
        greedy = tr.evaluate(state.params, seed=c.seed)
        sampled = rollout_metrics(tr.rollout(tr.run.parts.eval_rows, num_chains=2, seed=step), prefix="t1")
        print(
          f"  greedy: success {greedy['eval/success_rate']:.2f}, tool calls/chain "
          f"{greedy['eval/tool_calls_per_chain']:.2f}; sampled (T=1): success "
          f"{sampled['t1/success_rate']:.2f}, tool calls/chain {sampled['t1/tool_calls_per_chain']:.2f}",
          flush=True,
        )
    params = state.params
  model = nnx.merge(tr.run.parts.policy.graphdef, params, tr.run.parts.policy.rest)
  save_pretrained(model, _OUT.value, tokenizer_dir=_INIT.value or os.path.join(workdir, "tokenizer"))
  init_recipe = None
  if _INIT.value and os.path.isfile(os.path.join(_INIT.value, "warmstart.json")):
    with open(os.path.join(_INIT.value, "warmstart.json")) as f:
      init_recipe = json.load(f)
  with open(os.path.join(_OUT.value, "warmstart.json"), "w") as f:
    json.dump(
      {
        "command": " ".join(sys.argv),
        "init": _INIT.value or None,
        "init_recipe": init_recipe,
        "first_step": _FIRST_STEP.value,
        "copy_steps": _COPY_STEPS.value,
        "prior_steps": _PRIOR_STEPS.value,
        "tool_use_prob": _TOOL_USE_PROB.value,
        "batch": _BATCH.value,
        "lr": _LR.value,
        "prior_lr": _PRIOR_LR.value,
        "seed": c.seed,
        "family": _FAMILY.value,
        **(
          {
            "num_experts": _NUM_EXPERTS.value,
            "experts_per_tok": _EXPERTS_PER_TOK.value,
            "moe_intermediate": _MOE_INTERMEDIATE.value,
          }
          if _FAMILY.value == "qwen3_moe"
          else {}
        ),
        "guess_word_in_loss": False,
        "demo_keys": lookup.keys_fingerprint("train"),  # the demos' rows: task.make_rows, the train split
        "held_out_keys": lookup.keys_fingerprint("dev", "test"),
        "final_greedy": greedy,
        "final_sampled": sampled,
        "wall_s": time.time() - t0,
      },
      f,
      indent=2,
    )
  print(f"saved {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
