"""Run with 8 devices (tests/eight_device_checks.py, or alone as a script with
XLA_FLAGS=--xla_force_host_platform_device_count=8): the full trainer
(the README demo, configs/lookup_<algo>.py: rollout with the JAX sampler, prepare, train steps,
weight sync) on a (fsdp=2, tp=2) trainer mesh with its sampler on the other 4 devices gives the same
metrics as on one device, for each algo given on the command line (default ppo: the policy and its
critic both sharded; the critic-free algorithms run the same policy programs). Prints OK on success."""

import os
import sys
import tempfile

import jax
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(algo: str, fsdp: int, tp: int, workdir: str, sampler_devices: int = 0) -> list[dict]:
  from agentfly_jax.rl.config import lookup_config
  from agentfly_jax.rl.trainer import Trainer

  c = lookup_config(algo, os.path.join(ROOT, "experiments", "results", "lookup_warmstart"))
  c.mesh.fsdp, c.mesh.tp, c.mesh.sampler_devices = fsdp, tp, sampler_devices
  c.train.steps = 2
  c.rollout.rows_per_step, c.rollout.num_chains, c.rollout.max_turns = 2, 4, 2
  c.rollout.max_tokens_per_turn = 16
  c.train.micro_batch_size, c.train.minibatches = 4, 2
  c.loss.kl_coef, c.loss.entropy_coef = 0.01, 0.05  # gradients even when a group's rewards tie
  c.eval.every, c.eval.num_rows = 0, 0
  c.checkpoint.every = 100
  c.log.tensorboard = c.log.progress = False
  trainer = Trainer(c, workdir)
  records = trainer.train()
  leaves = jax.tree.leaves(trainer.state.params)
  specs = {str(x.sharding.spec) for x in leaves}
  if fsdp * tp > 1 and specs == {"PartitionSpec()"}:
    sys.exit(f"{algo} on {fsdp}x{tp}: params were not sharded")
  if sampler_devices:  # the sampler's copy lives on the last devices only, the trainer's not
    trainer_devices = set().union(*(x.sharding.device_set for x in leaves))
    sampler_devices_used = set().union(
      *(x.sharding.device_set for x in jax.tree.leaves(trainer.run.parts.sampler._params))
    )
    expected = set(jax.devices()[-sampler_devices:])
    if sampler_devices_used != expected or trainer_devices & expected:
      sys.exit(f"sampler sub-mesh: sampler on {sampler_devices_used}, trainer on {trainer_devices}")
    for a, b in zip(leaves, jax.tree.leaves(trainer.run.parts.sampler._params), strict=True):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # a copy of the final params
  return records


def check(algo: str) -> None:
  """The trainer with `algo` on a 2x2 mesh (fsdp- and tensor-parallel) with its sampler on its own 4 devices gives
  the 1-device run's metrics; raises AssertionError naming the metrics that differ."""
  assert len(jax.devices()) == 8, jax.devices()
  with tempfile.TemporaryDirectory() as tmp:
    one = run(algo, 1, 1, os.path.join(tmp, f"{algo}_1x1"))
    mesh = run(algo, 2, 2, os.path.join(tmp, f"{algo}_sub"), 4)
    diff = compare(algo, one, mesh)
    assert not diff, f"2x2 mesh + 4 sampler devices: {diff}"
    assert one[-1]["actor/kl_ref"] > 0 and (algo != "ppo" or one[-1]["critic/grad_norm"] > 0)
    print(f"{algo}: {len(one[0])} metrics equal on 1x1 and 2x2 mesh + 4 sampler devices", flush=True)


def main():
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  enable_compile_cache("auto")  # the test run's cache (AGENTFLY_COMPILE_CACHE)
  for algo in sys.argv[1:] or ["ppo"]:
    check(algo)
  print("OK")


def compare(algo, one, mesh) -> str:
  """The metrics of two runs that differ beyond float32 tolerance (time/* and sampler/* aside), one per line."""
  assert [r["step"] for r in one] == [1, 2] == [r["step"] for r in mesh]
  bad = []
  for a, b in zip(one, mesh):
    assert set(a) == set(b), set(a) ^ set(b)
    for k in a:
      if k.startswith(("time/", "sampler/")):  # wall clock, and the JAX engine's timing-dependent counters
        continue
      rtol, atol = 2e-3, 2e-4
      if not np.isclose(b[k], a[k], rtol=rtol, atol=atol):
        bad.append(f"{algo} step {a['step']} {k}: 1 device {a[k]!r}, mesh {b[k]!r}")
  return "\n".join(bad)


if __name__ == "__main__":
  main()
