"""Deviceless compile for NVIDIA GPUs: abstract H100 / H200 devices on a machine with no GPU and no
CUDA driver (the GPU half of rl/scale/aot.py's topologies, `--topology=h100:8`).

    devices = gpu_devices("h100", 8)     # 8 compile-only "NVIDIA H100 80GB HBM3" devices, one host
    mesh = jax.sharding.Mesh(np.array(devices), ("fsdp",))
    x = jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P("fsdp")))
    jax.jit(f).lower(x).compile().memory_analysis()   # bytes per GPU

Needs the CUDA PJRT plugin at jax's exact version and a CUDA toolkit for XLA's GPU compiler
(libdevice, ptxas): `pip install -e .[aot-gpu]` (jax-cuda12-plugin, nvidia-cuda-nvcc-cu12). The
plugin compiles without a device when it is given a GPU target config (XLA's
`GpuTargetConfigProto`, text format): the device description a real client would read from the
driver. `target_config` writes it from a `GpuSpec` (data-sheet numbers); `gpu_devices` passes it to
`jax.experimental.topologies.get_topology_desc(platform="cuda", topology="<slices>x<hosts>x<gpus>")`.
Nothing runs and nothing is autotuned (XLA uses its default GEMM configs); `cost_analysis()` is not
available for a deviceless GPU executable (None), `memory_analysis()` is.
"""

from __future__ import annotations

import dataclasses
import importlib.util

GIB = 1024**3


class GpuCompileUnavailable(RuntimeError):
  """No CUDA topology: the plugin is not installed (`pip install -e .[aot-gpu]`), or jax started its
  runtime (which needs a driver) instead of registering it compile-only."""


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  """What XLA's GPU compiler reads of a device (the fields of `GpuDeviceInfoProto` it uses to pick
  tilings, fusions and the PTX target). Bytes, bytes/s and GHz; `accelerated_features`: the
  architecture-specific target (sm_90a: wgmma, TMA), as a real Hopper reports it; `gpus_per_host` sets
  the topology's host split (an HGX board: 8 over NVLink)."""

  name: str
  compute_capability: tuple[int, int]
  sm_count: int
  memory_bytes: int
  memory_bandwidth: int
  l2_cache_bytes: int
  clock_ghz: float
  shared_memory_per_sm: int
  shared_memory_per_block_optin: int
  accelerated_features: bool = False
  cudnn_version: tuple[int, int] = (9, 8)
  gpus_per_host: int = 8


# Hopper SXM parts: 132 SMs, 228 KiB shared memory a SM (227 KiB opt-in a block), 50 MiB L2.
GPUS = {
  "h100": GpuSpec(
    "NVIDIA H100 80GB HBM3",
    (9, 0),
    sm_count=132,
    memory_bytes=84942979072,
    memory_bandwidth=3352320000000,
    l2_cache_bytes=50 * 1024**2,
    clock_ghz=1.98,
    shared_memory_per_sm=228 * 1024,
    shared_memory_per_block_optin=227 * 1024,
    accelerated_features=True,
  ),
  "h200": GpuSpec(
    "NVIDIA H200 141GB HBM3e",
    (9, 0),
    sm_count=132,
    memory_bytes=151397597184,
    memory_bandwidth=4800000000000,
    l2_cache_bytes=50 * 1024**2,
    clock_ghz=1.98,
    shared_memory_per_sm=228 * 1024,
    shared_memory_per_block_optin=227 * 1024,
    accelerated_features=True,
  ),
}


def is_gpu(generation: str) -> bool:
  return generation in GPUS


def hbm_gib(generation: str) -> float:
  """The device memory a GPU reports (GiB), e.g. 79.1 for an H100 80GB."""
  return GPUS[generation].memory_bytes / GIB


def target_config(spec: GpuSpec) -> str:
  """`spec` as an XLA `GpuTargetConfigProto` in text format."""
  major, minor = spec.compute_capability
  info = {
    "threads_per_block_limit": 1024,
    "threads_per_warp": 32,
    "shared_memory_per_block": 48 * 1024,
    "shared_memory_per_core": spec.shared_memory_per_sm,
    "threads_per_core_limit": 2048,
    "core_count": spec.sm_count,
    "fpus_per_core": 128,
    "block_dim_limit_x": 2**31 - 1,
    "block_dim_limit_y": 65535,
    "block_dim_limit_z": 65535,
    "memory_bandwidth": spec.memory_bandwidth,
    "l2_cache_size": spec.l2_cache_bytes,
    "clock_rate_ghz": spec.clock_ghz,
    "device_memory_size": spec.memory_bytes,
    "shared_memory_per_block_optin": spec.shared_memory_per_block_optin,
    "registers_per_core_limit": 65536,
    "registers_per_block_limit": 65536,
  }
  lines = ["gpu_device_info {"] + [f"  {k}: {v}" for k, v in info.items()]
  extension = " feature_extension: ACCELERATED_FEATURES" if spec.accelerated_features else ""
  lines += [
    f"  cuda_compute_capability {{ major: {major} minor: {minor}{extension} }}",
    "}",
    'platform_name: "CUDA"',
    f"dnn_version_info {{ major: {spec.cudnn_version[0]} minor: {spec.cudnn_version[1]} }}",
    f'device_description_str: "{spec.name}"',
  ]
  return "\n".join(lines) + "\n"


def plugin_available() -> bool:
  return (
    importlib.util.find_spec("jax_plugins") is not None
    and importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
  )


def topology_string(chips: int, gpus_per_host: int) -> str:
  """The CUDA plugin's '<slices>x<hosts per slice>x<devices per host>' for `chips` GPUs: one host
  up to `gpus_per_host`, else whole hosts (chips must be a multiple of gpus_per_host)."""
  if chips < 1:
    raise ValueError("needs at least one GPU")
  if chips <= gpus_per_host:
    return f"1x1x{chips}"
  if chips % gpus_per_host:
    raise ValueError(f"{chips} GPUs do not fill hosts of {gpus_per_host}")
  return f"1x{chips // gpus_per_host}x{gpus_per_host}"


def gpu_devices(generation: str, chips: int) -> list:
  """`chips` compile-only devices of GPU `generation` (a key of GPUS)."""
  if not plugin_available():
    raise GpuCompileUnavailable(
      "a GPU topology needs the CUDA PJRT plugin: pip install -e .[aot-gpu] "
      "(jax-cuda12-plugin at jax's version, nvidia-cuda-nvcc-cu12 for ptxas / libdevice)"
    )
  import jax
  from jax._src import xla_bridge
  from jax.experimental import topologies

  if not jax.config.jax_platforms and not xla_bridge.backends_are_initialized():
    # With no CUDA driver the plugin's runtime fails to initialise and takes its topology factory
    # with it; on the CPU platform alone it registers the factory without loading CUDA.
    jax.config.update("jax_platforms", "cpu")
  spec = GPUS[generation]
  try:
    topo = topologies.get_topology_desc(
      platform="cuda", target_config=target_config(spec), topology=topology_string(chips, spec.gpus_per_host)
    )
  except NotImplementedError as e:
    raise GpuCompileUnavailable(
      f"no CUDA topology ({e}): jax initialised the CUDA plugin's runtime first "
      "(no driver here); run with JAX_PLATFORMS=cpu"
    ) from None
  return list(topo.devices)
