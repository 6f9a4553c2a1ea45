"""Compile-only study of a run's programs for a TPU topology, or a GPU one (`h100:8`, rl/scale/aot_gpu.py)
(the library half of experiments/aot_compile.py, which documents the flags and the report; the
programs are built and compiled in rl/scale/aot_programs.py).

    report = compile_run(config, "v5e:2x2", model="qwen2.5-0.5b")   # rows: one per program, bytes a chip
    write_report(report, "lab/results/aot_x")        # .json + .md
    fit_advice(report, row)                                   # what would fit, for a row that does not

Bad input raises `BadInput` (before anything is compiled); the programs are built with the
trainer's own builders (rl/programs.py, rl/update.py, sampling/decode.py).
"""

from __future__ import annotations

import json
import os
import re

from agentfly_jax.rl.scale import aot_engine, aot_gpu, aot_programs, aot_teacher
from agentfly_jax.rl.scale.aot_programs import (  # noqa: F401 (re-exported: the compile half's public names)
  GIB,
  AbstractRun,
  abstract_model,
  abstract_run,
  compile_program,
  model_flops,
  oom_row,
  per_device_bytes,
  train_step_floor,
  with_shardings,
)

# Compile-only needs no exclusive hold on a TPU: without this a second libtpu process (another
# compile, a test) fails on libtpu's multi-process lockfile.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}  # per chip
HBM_GIB.update({gpu: aot_gpu.hbm_gib(gpu) for gpu in aot_gpu.GPUS})  # the device memory a GPU reports
_TOPOLOGY = re.compile(r"^(v4|v5e|v5p|v6e):(\d+)x(\d+)(?:x(\d+))?$")
_GPU_TOPOLOGY = re.compile(r"^(%s):(\d+)$" % "|".join(aot_gpu.GPUS))
# the report's order: the trainer's programs, the static sampler's, the paged engine's (rl/scale/aot_engine.py), the sync
COMPILERS = {
  "prepare": aot_programs.COMPILERS["prepare"],
  **aot_teacher.COMPILERS,  # on-policy distillation's teacher forward, beside prepare (rl/scale/aot_teacher.py)
  **{k: v for k, v in aot_programs.COMPILERS.items() if k not in ("prepare", "weight_sync")},
  **aot_engine.COMPILERS,
  "weight_sync": aot_programs.COMPILERS["weight_sync"],
}
PROGRAMS = tuple(COMPILERS)


class BadInput(ValueError):
  """Bad flags or config: reported before anything is compiled (exit 1)."""


class DoesNotFit(RuntimeError):
  """A compiled program's peak exceeds the chip's HBM (exit 2)."""


def compile_rows(run: AbstractRun, programs, chips: int) -> list[dict]:
  """One row per program in `programs`, compiled in COMPILERS' order (the report's)."""
  return [compile_one(run, chips) for name, compile_one in COMPILERS.items() if name in programs]


# ---------------------------------------------------------------- inputs
def parse_topology(name: str) -> tuple[str, int]:
  """(generation, number of chips) of '<gen>:<AxB[xC]>' (TPU) or '<gpu>:<N>' (GPU); BadInput naming it
  otherwise."""
  g = _GPU_TOPOLOGY.match(name or "")
  if g:
    generation, chips = g.group(1), int(g.group(2))
    try:
      aot_gpu.topology_string(chips, aot_gpu.GPUS[generation].gpus_per_host)
    except ValueError as e:
      raise BadInput(f"--topology={name!r}: {e}") from None
    return generation, chips
  m = _TOPOLOGY.match(name or "")
  if not m:
    raise BadInput(
      f"--topology={name!r} is unknown or malformed: expected <gen>:<shape> with gen one of "
      f"{sorted(set(HBM_GIB) - set(aot_gpu.GPUS))} and shape like 2x2 or 2x2x2 (e.g. v5e:2x2, "
      f"v5p:2x2x2), or <gpu>:<count> with gpu one of {sorted(aot_gpu.GPUS)} (e.g. h100:8)"
    )
  chips = 1
  for d in m.groups()[1:]:
    if d is not None:
      chips *= int(d)
  return m.group(1), chips


def topology_devices(name: str):
  generation, chips = parse_topology(name)
  if aot_gpu.is_gpu(generation):
    try:
      return aot_gpu.gpu_devices(generation, chips)
    except aot_gpu.GpuCompileUnavailable as e:
      raise BadInput(f"--topology={name!r}: {e}") from None
  from jax.experimental import topologies

  try:
    return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
  except Exception as e:  # libtpu refuses shapes it does not know
    raise BadInput(
      f"--topology={name!r}: libtpu does not know this topology ({str(e).splitlines()[0][:200]})"
    ) from None


def check_mesh(spec, chips: int, topology: str) -> None:
  m = spec.mesh
  tp = m.tp
  fsdp = chips // (tp * m.expert) if m.fsdp == -1 else m.fsdp
  used = fsdp * tp * m.expert + m.sampler_devices
  if fsdp < 1 or tp < 1 or used != chips:
    raise BadInput(
      f"mesh fsdp={m.fsdp} x tp={m.tp}"
      + (f" x expert={m.expert}" if m.expert > 1 else "")
      + (f" + sampler_devices={m.sampler_devices}" if m.sampler_devices else "")
      + f" = {used} chips does not divide the {chips} chips "
      f"of {topology} (set --config.mesh.fsdp / --config.mesh.tp so that they use all {chips})"
    )


def load_hf_config(model: str, spec) -> tuple[dict | None, str]:
  """(HF config dict, its source) from --model; (None, 'config') for the run's own model."""
  from agentfly_jax.models.presets import PRESETS, preset_hf_config

  model = model or spec.model.aot_preset
  if not model:
    if spec.model.pretrained:
      model = spec.model.pretrained
    else:
      return None, "config.model (random init)"
  if model.lower() in PRESETS:
    return preset_hf_config(model), f"preset {model}"
  path = os.path.join(model, "config.json") if os.path.isdir(model) else model
  if not os.path.isfile(path):
    raise BadInput(f"--model={model!r} is neither a preset ({sorted(PRESETS)}) nor an HF config.json / folder")
  try:
    with open(path) as f:
      return json.load(f), path
  except json.JSONDecodeError as e:
    raise BadInput(f"{path}: not valid JSON ({e})") from None


def model_config(spec, hf: dict | None, source: str):
  """The ModelConfig of `hf` (an HF config.json's dict) with the run's numerics, else the run's own
  (`spec`: the run's RunSpec)."""
  from agentfly_jax.models import ModelConfig
  from agentfly_jax.rl import setup

  if hf is None:
    return setup.model_config(spec, spec.model.vocab_size)
  try:
    return ModelConfig.from_hf_dict(hf, source=source, **setup.model_numerics(spec))
  except ValueError as e:
    raise BadInput(str(e)) from None


# ---------------------------------------------------------------- the run: check, build, compile, report
def _check_programs(programs) -> None:
  unknown = sorted(set(programs) - set(PROGRAMS))
  if unknown:
    raise BadInput(f"--programs: unknown programs {unknown}; known: {list(PROGRAMS)}")


def _checked_model_config(spec, model: str, chips: int, topology: str):
  """The run's ModelConfig (of --model, else the run's own), after its mesh is checked against the
  topology's `chips`; BadInput naming what is wrong."""
  check_mesh(spec, chips, topology)
  if spec.model.attention_impl == "pallas" and aot_gpu.is_gpu(parse_topology(topology)[0]):
    raise BadInput(
      f"model.attention_impl='pallas' is the TPU kernel and --topology={topology!r} is a GPU: "
      "add --config.model.attention_impl=flash"
    )
  return model_config(spec, *load_hf_config(model, spec))


def _report(abstract: AbstractRun, topology: str, chips: int, hbm: float, rows: list[dict]) -> dict:
  """The report of the compiled `rows` (each marked with the chip's HBM and whether it fits)."""
  cfg, spec = abstract.cfg, abstract.spec
  for row in rows:
    row["hbm_bytes"] = int(hbm)
    row["fits"] = row["peak_bytes"] <= hbm and not row.get("xla_refused")
  return {
    "topology": topology,
    "chips": chips,
    "hbm_gib": hbm / GIB,
    "model": cfg.model_type,
    "num_params": abstract.num_params,
    "num_hidden_layers": cfg.num_hidden_layers,
    "scan_layers": cfg.scan_layers,
    "remat": str(cfg.remat),
    "attention_impl": cfg.attention_impl,
    "dtype": cfg.dtype,
    "param_dtype": cfg.param_dtype,
    "mesh": {
      "fsdp": abstract.fsdp,
      "tp": abstract.mesh.shape["tp"],
      "expert": abstract.mesh.shape.get("expert", 1),
      "sampler_devices": spec.mesh.sampler_devices,
    },
    "algo": spec.algo,
    "seq_len": abstract.seq_len,
    "micro_batch_size": spec.train.micro_batch_size,
    "rows": rows,
  }


def compile_run(
  spec, topology: str, model: str = "", programs=PROGRAMS, seq_len: int = 0, hbm_gib: float = 0.0, images: str = ""
) -> dict:
  """Compiles `programs` of the run `spec` (rl/spec.RunSpec: the tool parses its config once) for
  `topology`; returns the report (rows per program). `images`: a vision-language policy's images a row
  (rl/scale/aot_batches.parse_images: "COUNTxWIDTHxHEIGHT"; "" = a GUI screenshot a turn)."""
  _check_programs(programs)
  generation, chips = parse_topology(topology)
  cfg = _checked_model_config(spec, model, chips, topology)
  if "teacher" in programs:
    try:
      aot_teacher.teacher_config(spec)
    except ValueError as e:
      raise BadInput(str(e)) from None
  devices = topology_devices(topology)
  hbm = (hbm_gib or HBM_GIB[generation]) * GIB
  try:
    abstract = abstract_run(spec, cfg, devices, seq_len or spec.rollout.max_total_tokens, images)
  except ValueError as e:
    if "--images" not in str(e):
      raise
    raise BadInput(str(e)) from None
  print(
    f"aot_compile: {cfg.model_type} {abstract.num_params / 1e9:.2f} B params, scan_layers={cfg.scan_layers}, "
    f"remat={cfg.remat}, on {topology} ({chips} chips, {hbm / GIB:.0f} GiB HBM each), mesh "
    f"fsdp={abstract.fsdp} x tp={abstract.mesh.shape['tp']}"
    + (f" x expert={abstract.mesh.shape['expert']}" if abstract.mesh.shape.get("expert", 1) > 1 else ""),
    flush=True,
  )
  return _report(abstract, topology, chips, hbm, compile_rows(abstract, programs, chips))


def fit_advice(report: dict, row: dict) -> str:
  """What would fit, estimated from the row's bytes (state vs temporaries)."""
  if "cache_bytes" in row:
    return _engine_fit_advice(row)
  hbm, peak = row["hbm_bytes"], row["peak_bytes"]
  fixed = row["argument_bytes"] + row["output_bytes"] - row["alias_bytes"]
  tips = []
  if report["remat"] in ("False", "none", ""):
    tips.append("--config.train.remat=full (keeps only each layer's input)")
  if row["temp_bytes"] and fixed < hbm:
    scale = (hbm * 0.9 - fixed) / row["temp_bytes"]
    if scale < 1:
      mb = max(1, int(report["micro_batch_size"] * scale))
      tips.append(f"--config.train.micro_batch_size={mb} (temporaries scale ~linearly with it)")
  chips = report["chips"] * peak / (hbm * 0.9)
  if report["mesh"].get("expert", 1) > 1:  # a mixture of experts: the experts split over expert, the rest over both
    tips.append(
      f"a topology of >= {int(-(-chips // 1))} chips with mesh.fsdp x mesh.expert over them (the state splits "
      "over fsdp x expert)"
    )
  else:
    tips.append(f"a topology of >= {int(-(-chips // 1))} chips with mesh.fsdp over them (the state splits over fsdp)")
  return "; or ".join(tips)


def _engine_fit_advice(row: dict) -> str:
  """A paged engine row's advice: a smaller KV cache (rollout.kv_cache_gib, the cache's bytes a chip: every chip
  holds every page), assuming its peak grows by twice the cache (the cache argument + the temporary copy XLA
  keeps of it, as the committed TPU rows measure: temp >= cache)."""
  other = row["peak_bytes"] - 2 * row["cache_bytes"]
  gib = (row["hbm_bytes"] * 0.9 - other) / 2 / GIB
  if gib <= 0:
    return (
      f"without its KV cache the program still needs {other / GIB:.2f} GiB a chip: more chips, or "
      "--config.rollout.max_batch_size smaller (fewer decode slots)"
    )
  return (
    f"--config.rollout.kv_cache_gib={gib:.2f} (the cache is {row['cache_bytes'] / GIB:.2f} GiB a chip now, "
    "sized for every slot at max_len; a smaller one preempts rows when full)"
  )


def write_report(report: dict, out: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  with open(out + ".json", "w") as f:
    json.dump(report, f, indent=2)
  lines = [
    f"# AOT compile: {report['model']} ({report['num_params'] / 1e9:.2f} B params, "
    f"{report['num_hidden_layers']} layers, scan_layers={report['scan_layers']}, remat={report['remat']}) "
    f"on {report['topology']}",
    "",
    f"{report['chips']} chips x {report['hbm_gib']:.0f} GiB HBM; mesh {report['mesh']}; {report['algo']}; "
    f"{report['dtype']} compute, {report['param_dtype']} params; rows of {report['seq_len']} tokens. "
    "Bytes are per chip (XLA memory_analysis); peak = arguments + outputs - aliased + temporaries.",
    "",
    "| program | shape | compile s | args GiB | temp GiB | peak GiB | fits | XLA TFLOP/chip (loop bodies "
    "once) | model TFLOP/chip | floor GiB | memory_plan GiB |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  g = lambda b: f"{b / GIB:.2f}" if b is not None else ""  # noqa: E731
  tf = lambda f: "" if f is None else f"{f / 1e12:.1f}"  # noqa: E731
  for row in report["rows"]:
    lines.append(
      f"| {row['program']} | {row.get('micro_batch', '')} | {row['compile_s']:.1f} | "
      f"{g(row['argument_bytes'])} | {g(row['temp_bytes'])} | {g(row['peak_bytes'])} | "
      f"{'yes' if row['fits'] else 'NO'} | {tf(row['flops'])} | {tf(row.get('model_flops'))} | "
      f"{g(row.get('floor_bytes'))} | {g(row.get('memory_plan_bytes'))} |"
    )
  with open(out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")


def _table_header(gpu: bool) -> list[str]:
  """The collected table's title, legend and column header (GPU or TPU topologies)."""
  return [
    f"# Programs of a run compiled for {'GPU' if gpu else 'TPU'} topologies (XLA, per chip)",
    "",
    "Compiled on a shared 2-core CPU with "
    + (
      "jax 0.10.2 + jax-cuda12-plugin (deviceless, no GPU; XLA TFLOP not reported for GPU)"
      if gpu
      else "jax[tpu] 0.10.2 / libtpu"
    )
    + " (experiments/aot_compile.py; "
    "compile times are under load from other jobs). peak = arguments + outputs - aliased + "
    "temporaries. floor: sharded params + grads + Adam moments + one layer's gathered weights + "
    "remat-kept layer inputs (by hand; a mixture of experts on an expert axis: a chip's own experts of the "
    "layer gathered, + its tokens' k assignments sent and received by all_to_all); memory_plan: "
    "rl/scale/memory_plan.py's estimate (per_chip_jax_parts, no margin; its parts are in the JSON). XLA TFLOP: "
    "cost_analysis, which counts a loop body once (scanned layers, micro-batch accumulation, decode "
    "loop); model TFLOP: 6ND + causal attention (+ remat's extra forward), the whole step.",
    "",
    "| model | topology | mesh | layers | remat | program | shape | compile s | peak GiB | HBM GiB | fits | "
    "XLA TFLOP/chip | model TFLOP/chip | floor GiB | memory_plan GiB | memory_plan / XLA |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]


def append_to_table(report: dict, prefix: str, label: str = "") -> None:
  """Adds `report` (labelled, e.g. the preset name) to the collected table `<prefix>.json` (a list of
  reports; one with the same label, topology, layout, mesh and programs is replaced) and rewrites
  `<prefix>.md` with one row per (report, program)."""
  path = prefix + ".json"
  reports = []
  if os.path.isfile(path):
    with open(path) as f:
      reports = json.load(f)
  report = dict(report, label=label or report["model"])
  key = lambda r: (
    r["label"],
    r["topology"],
    r["scan_layers"],
    r["remat"],  # noqa: E731
    r.get("attention_impl", "flash"),
    (r["mesh"]["fsdp"], r["mesh"]["tp"], r["mesh"].get("expert", 1)),
    tuple(sorted(x["program"] for x in r["rows"])),
  )
  reports = [r for r in reports if key(r) != key(report)] + [report]
  _write_table(reports, prefix)


def replan_table(prefix: str) -> int:
  """Re-estimates every train-step row of the collected table `<prefix>.json` with today's
  rl/scale/memory_plan.py (from the ModelShape / RunSizes / mesh each row recorded, no compile) and
  rewrites `<prefix>.{json,md}`; returns the number of rows re-estimated. A row without recorded
  inputs (compiled before they were) keeps its estimate."""
  from agentfly_jax.rl.scale.aot_programs import estimate_from_inputs

  with open(prefix + ".json") as f:
    reports = json.load(f)
  n = 0
  for r in reports:
    for row in r["rows"]:
      if "memory_plan_inputs" in row:
        plan = estimate_from_inputs(row["memory_plan_inputs"])
        row["memory_plan_bytes"], row["memory_plan_parts"] = plan["total"], plan["parts"]
        n += 1
  _write_table(reports, prefix)
  return n


def _write_table(reports: list[dict], prefix: str) -> None:
  """`<prefix>.json` (the reports) and `<prefix>.md` (one row per report and program)."""
  os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
  with open(prefix + ".json", "w") as f:
    json.dump(reports, f, indent=2)
  g = lambda b: "" if b is None else f"{b / GIB:.2f}"  # noqa: E731
  tf = lambda f: "" if f is None else f"{f / 1e12:.2f}"  # noqa: E731
  lines = _table_header(all(aot_gpu.is_gpu(parse_topology(r["topology"])[0]) for r in reports))
  for r in reports:
    mesh = f"fsdp {r['mesh']['fsdp']} x tp {r['mesh']['tp']}"
    mesh += f" x expert {r['mesh']['expert']}" if r["mesh"].get("expert", 1) > 1 else ""
    layout = f"{r['num_hidden_layers']} {'scanned' if r['scan_layers'] else 'unrolled'}"
    layout += ", pallas attention" if r.get("attention_impl") == "pallas" else ""
    for row in r["rows"]:
      plan = row.get("memory_plan_bytes")
      ratio = "" if plan is None else f"{plan / row['peak_bytes']:.2f}"
      if ratio and row.get("xla_refused"):  # XLA stops before scheduling: its count is not a compiled program's
        ratio = f"({ratio}: XLA's count before it refused)"
      mf = "" if row.get("model_flops") is None else f"{row['model_flops'] / 1e12:.1f}"
      lines.append(
        f"| {r['label']} | {r['topology']} | {mesh} | {layout} | {r['remat']} | {row['program']} | "
        f"{row.get('micro_batch', '')} | {row['compile_s']:.0f} | {g(row['peak_bytes'])} | "
        f"{row['hbm_bytes'] / GIB:.0f} | {'yes' if row['fits'] else 'NO'} | {tf(row['flops'])} | "
        f"{mf} | {g(row.get('floor_bytes'))} | {g(plan)} | {ratio} |"
      )
  dated = [r for r in reports if r.get("date")]
  if dated:
    lines += ["", "Compiled on (date, commit of the compiling tree):", ""]
    lines += [
      f"- {r['label']} on {r['topology']}, {', '.join(x['program'] for x in r['rows'])}: {r['date']}, {r['commit']}"
      for r in dated
    ]
  with open(prefix + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
