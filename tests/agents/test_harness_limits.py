"""A harness's rlimits (agents/harness.run_harness `limits`, set by harness_reaper before the command runs):
a write past the file-size limit and an allocation past the memory limit fail inside the harness, whose
tree inherits them; the same command under no limit succeeds."""

import os
import sys

import trio

from agentfly_jax.agents.harness import run_harness

WRITE_3MB = "open('big.bin', 'wb').write(b'x' * (3 << 20)); print('wrote')"
ALLOC_1GB = "b = bytearray(1 << 30); print('allocated')"
CHILD_WRITES = "import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', %r]))" % WRITE_3MB


def _run(code: str, limits, tmp_path):
  env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HOME": str(tmp_path)}
  words = [sys.executable, "-I", "-c", f"import os; os.chdir({str(tmp_path)!r}); " + code]
  return trio.run(lambda: run_harness(words, env=env, stdin=b"", limits=limits))


def test_file_size_and_memory_limits_hold_for_the_harness_and_its_children(tmp_path):
  status, out, err = _run(WRITE_3MB, (0, 1, 0), tmp_path)
  assert status != 0 and b"File too large" in err and b"wrote" not in out
  status, out, err = _run(CHILD_WRITES, (0, 1, 0), tmp_path)  # a child of the harness inherits the limit
  assert status != 0 and b"File too large" in err
  status, out, err = _run(ALLOC_1GB, (512, 0, 0), tmp_path)
  assert status != 0 and b"MemoryError" in err and b"allocated" not in out
  status, out, _ = _run(WRITE_3MB + "\n" + ALLOC_1GB, (0, 0, 0), tmp_path)  # no limits: both succeed
  assert status == 0 and out.split() == [b"wrote", b"allocated"]
