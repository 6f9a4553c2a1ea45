"""Multi-host training on one machine: 2 JAX processes (loopback coordinator, CPU, gloo
collectives), each rolling out its share of the global batch, train the demo for 2 steps; both
end with identical params, equal to a 1-process run over the same global batch; only process 0
writes metrics."""

import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from train_cli import ROOT, read_metrics

CHECK = os.path.join(ROOT, "tests", "multihost_train_check.py")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(**extra):
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("AGENTFLY_COORD", "AGENTFLY_NUM_P", "AGENTFLY_PROCESS", "XLA_FLAGS"))
  }
  # XLA:CPU's LLVM backend at -O0: 2 training steps of a tiny model, compiling dominates (as in the
  # 8-device checks, tests/conftest.py); all three processes alike
  env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_backend_optimization_level=0", **extra)
  return env


def _load(path):
  with np.load(path) as z:
    return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, CHECK, str(tmp_path / "multi"), str(tmp_path / "out_multi"), "2"],
      cwd=ROOT,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
      env=_env(
        AGENTFLY_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", AGENTFLY_NUM_PROCESSES="2", AGENTFLY_PROCESS_ID=str(i)
      ),
    )
    for i in range(2)
  ]
  single = subprocess.run(
    [sys.executable, CHECK, str(tmp_path / "single"), str(tmp_path / "out_single")],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env=_env(),
    timeout=1500,
  )
  outs = [p.communicate(timeout=1500)[0] for p in procs]
  for i, (p, out) in enumerate(zip(procs, outs)):
    assert p.returncode == 0 and f"OK process {i} of 2" in out, out[-4000:]
  assert single.returncode == 0, single.stdout[-2000:] + single.stderr[-3000:]

  p0, p1 = _load(tmp_path / "out_multi" / "params_0.npz"), _load(tmp_path / "out_multi" / "params_1.npz")
  ref = _load(tmp_path / "out_single" / "params_0.npz")
  assert set(p0) == set(p1) == set(ref)
  for k in p0:
    np.testing.assert_array_equal(p0[k], p1[k], err_msg=k)  # both processes hold the same params
  # vs 1 process: float32 reduction order differs (2 devices vs 1). Adam turns the sign noise of
  # near-zero gradient entries into steps of up to ~lr (5e-4) on a few of them; all else agrees.
  diff = np.concatenate([np.abs(p0[k] - ref[k]).ravel() for k in sorted(p0)])
  assert diff.max() < 2.5e-4 and (diff > 1e-5).mean() < 1e-3, (diff.max(), (diff > 1e-5).mean())
  multi, one = read_metrics(tmp_path / "multi"), read_metrics(tmp_path / "single")
  assert [r["step"] for r in multi] == [1, 2] == [r["step"] for r in one]  # one writer
  for a, b in zip(one, multi):
    for k in (
      "rollout/reward_mean",
      "rollout/tokens_total_mean",
      "actor/pg_loss",
      "actor/grad_norm",
      "actor/kl_ref",
      "adv/abs_mean",
    ):
      assert b[k] == pytest.approx(a[k], rel=1e-3, abs=1e-5), k
  assert one[-1]["actor/kl_ref"] > 0  # the policy moved
  assert sorted(int(p) for p in os.listdir(tmp_path / "multi" / "checkpoints") if p.isdigit())[-1] == 2
