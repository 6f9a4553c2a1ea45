"""Every 8-device check of the suite in ONE child process (JAX started once with
XLA_FLAGS=--xla_force_host_platform_device_count=8; programs compiled once for all):

    python tests/eight_device_checks.py sharding train_step sampler_sharding trainer_mesh ...

Each named check runs in turn, its stdout captured; one JSON line per check goes to stdout,
prefixed `CHECK ` ({"check", "ok", "output", "seconds", "cpu_seconds"}: wall time and this process's
CPU time, all threads), whatever the others did. The test run's fixture `_eight_device_results`
(tests/conftest.py) starts this process once for the checks the selected tests name and hands each
test its own result.
"""

import contextlib
import io
import json
import sys
import time
import traceback


def _sharding():
  import sharding_check

  sharding_check.main()


def _train_step():
  import multidevice_train_check

  multidevice_train_check.main()


def _sampler_sharding():
  import sampler_sharding_check

  sampler_sharding_check.main()


def _activation_sharding():
  import activation_sharding_check

  activation_sharding_check.main()


def _lora_mesh():
  import lora_mesh_check

  lora_mesh_check.main()


def _moe_ep():
  import moe_ep_check

  moe_ep_check.main()


def _trainer_mesh():
  import mesh_trainer_check

  mesh_trainer_check.check("ppo")


CHECKS = {
  "sharding": _sharding,  # tests/models/test_models_sharding.py
  "train_step": _train_step,  # tests/rl/test_train_step.py
  "sampler_sharding": _sampler_sharding,  # tests/sampling/test_jax_sampler.py
  "lora_mesh": _lora_mesh,  # tests/models/test_models_lora_mesh.py
  "activation_sharding": _activation_sharding,  # tests/models/test_models_activation_sharding.py
  "moe_ep": _moe_ep,  # tests/models/test_moe_ep.py
  "trainer_mesh": _trainer_mesh,  # tests/multidevice/test_trainer_mesh.py
}


def main(names):
  import jax
  from agentfly_jax.rl.scale.compile_cache import enable_compile_cache

  enable_compile_cache("auto")  # the test run's cache (AGENTFLY_COMPILE_CACHE)
  if len(jax.devices()) != 8:
    sys.exit(f"eight_device_checks: needs 8 devices, got {jax.devices()}")
  unknown = [n for n in names if n not in CHECKS]
  if unknown:
    sys.exit(f"eight_device_checks: unknown checks {unknown}; known: {sorted(CHECKS)}")
  for name in names:
    out, t0, cpu0, ok = io.StringIO(), time.perf_counter(), time.process_time(), True
    with contextlib.redirect_stdout(out):
      try:
        CHECKS[name]()
      except BaseException as e:  # noqa: BLE001 -- a failing check (assert, sys.exit) is reported, the rest run
        ok = False
        print(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    print(
      "CHECK "
      + json.dumps(
        {
          "check": name,
          "ok": ok,
          "output": out.getvalue()[-6000:],
          "seconds": round(time.perf_counter() - t0, 1),
          "cpu_seconds": round(time.process_time() - cpu0, 1),
        }
      ),
      flush=True,
    )


if __name__ == "__main__":
  main(sys.argv[1:] or list(CHECKS))
