"""One process of a multi-process training run (or the 1-process reference run).

    AGENTFLY_COORDINATOR_ADDRESS=127.0.0.1:PORT AGENTFLY_NUM_PROCESSES=2 AGENTFLY_PROCESS_ID=i \
      python tests/multihost_train_check.py WORKDIR OUT_DIR [FSDP]

Trains the lookup demo (GRPO, tiny settings) for 2 steps in WORKDIR (shared by the processes)
and writes OUT_DIR/params_<process index>.npz: the final policy params as this process holds
them (gathered to the host). Prints OK.
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main():
  workdir, out_dir = sys.argv[1], sys.argv[2]
  fsdp = int(sys.argv[3]) if len(sys.argv) > 3 else 1
  from agentfly_jax.rl import distributed
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  enable_compile_cache("auto")  # the test run's cache (AGENTFLY_COMPILE_CACHE)
  distributed.initialize()  # from the AGENTFLY_* environment (no-op when unset)
  import jax
  import numpy as np
  from flax import nnx
  from agentfly_jax.rl.config import lookup_config
  from agentfly_jax.rl.trainer import Trainer

  c = lookup_config("grpo", os.path.join(ROOT, "experiments", "results", "lookup_warmstart"))
  c.mesh.fsdp = fsdp
  c.train.steps = 2
  c.rollout.rows_per_step, c.rollout.num_chains, c.rollout.max_turns = 2, 4, 2
  c.rollout.max_tokens_per_turn = 16
  c.rollout.batch_invariant = True  # a process's tokens do not depend on which of its rows shared a batch
  c.train.micro_batch_size = 4
  c.loss.kl_coef, c.loss.entropy_coef = 0.01, 0.05  # gradients even when a group's rewards tie
  c.eval.every, c.eval.num_rows = 0, 0
  c.checkpoint.every = 1
  c.log.tensorboard = c.log.progress = False
  trainer = Trainer(c, workdir)
  trainer.train()
  host = distributed.host_local(trainer.state.params)
  flat = {
    "/".join(map(str, path)): np.asarray(jax.device_get(v[...] if isinstance(v, nnx.Variable) else v))
    for path, v in nnx.to_flat_state(host)
  }
  os.makedirs(out_dir, exist_ok=True)
  np.savez(os.path.join(out_dir, f"params_{jax.process_index()}.npz"), **flat)
  print(f"OK process {jax.process_index()} of {jax.process_count()}", flush=True)


if __name__ == "__main__":
  main()
