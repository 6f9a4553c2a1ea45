"""Build a teacher for on-policy distillation on the lookup task: the lookup_grpo recipe (configs/lookup_grpo.py:
the shipped warm start, lr 5e-4, 40 GRPO steps, dev success 1.00 in LEARNING.md) trained once, its final policy
saved as an HF folder over the warm start's tokenizer (the student's: distillation needs one vocabulary).

  .venv/bin/python experiments/make_lookup_teacher.py --out=experiments/results/lookup_teacher

The folder's teacher.json records the command, the seed, the final dev eval and the wall time. The student runs
(configs/distill_lookup_slow.py) read it as config.teacher.pretrained.
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_OUT = flags.DEFINE_string("out", os.path.join(ROOT, "experiments", "results", "lookup_teacher"), "Output HF folder.")
_WORKDIR = flags.DEFINE_string("workdir", os.path.join(ROOT, "runs", "lookup_teacher"), "Training workdir.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed (the learning table's counted seeds of the students are 1-3).")
_STEPS = flags.DEFINE_integer("steps", 40, "GRPO steps.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  from flax import nnx

  from agentfly_jax.models import save_pretrained
  from agentfly_jax.rl.config import lookup_config
  from agentfly_jax.rl.trainer import Trainer

  warmstart = os.path.join(ROOT, "experiments", "results", "lookup_warmstart")
  c = lookup_config("grpo", warmstart)
  c.seed, c.train.steps = _SEED.value, _STEPS.value
  c.eval.every, c.checkpoint.every = 10, 10
  c.log.progress = False
  start = time.time()
  trainer = Trainer(c, _WORKDIR.value)
  records = trainer.train()
  policy = trainer.run.parts.policy
  save_pretrained(nnx.merge(policy.graphdef, trainer.state.params, policy.rest), _OUT.value, tokenizer_dir=warmstart)
  evals = [{k: r[k] for k in r if k.startswith("eval/") or k == "step"} for r in records if "eval/success_rate" in r]
  with open(os.path.join(_OUT.value, "teacher.json"), "w") as f:
    json.dump(
      {
        "command": " ".join(sys.argv),
        "seed": _SEED.value,
        "steps": _STEPS.value,
        "evals": evals,
        "wall_s": time.time() - start,
      },
      f,
      indent=1,
    )
  print(json.dumps(evals[-1] if evals else {}))


if __name__ == "__main__":
  app.run(main)
