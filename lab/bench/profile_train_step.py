"""Where the train step's time goes: the compiled policy step, op by op, by category.

    .venv/bin/python lab/bench/profile_train_step.py --models=smollm2_random --num_layers=4 \
        --shapes=8x256 --frameworks=jax,jax+plain --steps=policy --repeats=2

For each (model, shape, JAX variant; `bench_train_step`'s flags and variants) it compiles the same
step as the bench and reports:
- from the optimized HLO (`compiled.as_text()`): instruction counts and result bytes by category
  (dot = GEMMs incl. library-fused ones, copy, transpose (pure layout change), elementwise
  fusion, elementwise+transpose (a fusion that writes its result in another layout, e.g. the
  transposed operand of a weight-gradient GEMM), reduce, gather / scatter / slices, control
  flow), each split into weights (result shaped like a parameter or its transpose) and
  activations;
- XLA's cost analysis (flops, bytes accessed) and memory analysis (temporaries);
- from a `jax.profiler` trace of `--repeats` steps: the time of each thunk (the HLO instruction it
  runs), summed by the same categories, and the top ops. XLA:CPU's thunk executor runs
  independent ops on several cores at once, so the sums can exceed the wall; they are a profile,
  not a clock.
Results: lab/results/<out>.json + .md (machine named: this is a shared 2-core CPU).
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

from absl import app, flags


import bench_train_step as bench  # noqa: E402 (defines the shared flags: models, shapes, frameworks, ...)
from bench_common import cpu_name, load_note  # noqa: E402
from bench_common import RESULTS_DIR  # this folder is on sys.path: the script's own

FLAGS = flags.FLAGS
flags.DEFINE_string("profile_out", "profile_train_step", "result file stem in lab/results/")
flags.DEFINE_integer("top", 25, "top ops listed per variant")
flags.DEFINE_integer("top_gemms", 10, "GEMM shapes (by FLOPs per step) timed in JAX and torch")
flags.DEFINE_string("hlo_dir", "", "also write each variant's optimized HLO text here")

# Instruction line of HLO text: "  [ROOT] name = shape opcode(operands), attrs"
_INSTR = re.compile(
  r"^\s*(?:ROOT\s+)?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>\(.*?\)|[\w\[\]{},:\s]+?)\s+"
  r"(?P<op>[a-z][\w\-]*)\((?P<args>.*)$"
)
_ARRAY = re.compile(r"(pred|s8|s16|s32|s64|u8|u16|u32|u64|bf16|f16|f32|f64)\[([\d,]*)\]")
_BYTES = {
  "pred": 1,
  "s8": 1,
  "u8": 1,
  "s16": 2,
  "u16": 2,
  "bf16": 2,
  "f16": 2,
  "s32": 4,
  "u32": 4,
  "f32": 4,
  "s64": 8,
  "u64": 8,
  "f64": 8,
}
CATEGORIES = (
  "dot",
  "copy",
  "transpose",
  "reduce",
  "elementwise",
  "elementwise+transpose",
  "gather/scatter/slice",
  "control",
  "other",
)


def _arrays(shape_text: str) -> list[tuple[str, tuple[int, ...]]]:
  return [(dt, tuple(int(d) for d in dims.split(",") if d)) for dt, dims in _ARRAY.findall(shape_text)]


def parse_hlo(text: str) -> dict[str, dict]:
  """Optimized HLO text -> {computation name: {"instrs": [{name, op, shape, dims, bytes, calls, line}]}}."""
  comps, current = {}, None
  for line in text.splitlines():
    header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+.*\{\s*$", line)
    if header and not line.startswith(" "):
      current = comps.setdefault(header.group(1), {"entry": line.startswith("ENTRY"), "instrs": []})
      continue
    m = _INSTR.match(line.replace("%", ""))
    if current is None or not m:
      continue
    arrays = _arrays(m.group("shape"))
    calls = re.findall(r"(?:calls|body|condition|to_apply|branch_computations)=\{?([\w.\-, ]+)\}?", m.group("args"))
    current["instrs"].append(
      {
        "name": m.group("name"),
        "op": m.group("op"),
        "dims": [a[1] for a in arrays],
        "operands": re.findall(r"([\w.\-]+)", m.group("args").split(")", 1)[0]),
        "args": m.group("args"),
        "bytes": sum(_BYTES.get(dt, 4) * _prod(d) for dt, d in arrays),
        "calls": [c.strip() for group in calls for c in group.split(",")],
        "kind": (re.search(r"kind=(k\w+)", m.group("args")) or [None, ""])[1],
        # a GEMM XLA hands to a library (YNNPACK / XNNPACK / oneDNN): kCustom fusion or custom-call
        "library": bool(re.search(r'"kind":"__(ynn|xnn|onednn)|custom_call_target="__onednn', m.group("args"))),
      }
    )
  return comps


def _dims_attr(args: str, key: str) -> tuple[int, ...]:
  m = re.search(key + r"=\{([\d,]*)\}", args)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def dot_signature(comps: dict, instr: dict):
  """The GEMM a thunk-level dot / library fusion runs: ((lhs dims, rhs dims, lhs contracting,
  rhs contracting, lhs batch, rhs batch), flops) or None."""
  if instr["op"] == "dot":
    where, dot = None, instr
  else:
    where = comps.get(instr["calls"][0] if instr["calls"] else "", {"instrs": []})
    dot = next((i for i in where["instrs"] if i["op"] == "dot"), None)
    if dot is None:
      return None
  scope = where["instrs"] if where else [i for c in comps.values() for i in c["instrs"]]
  shapes = {i["name"]: i["dims"][0] for i in scope if len(i["dims"]) == 1}
  if len(dot["operands"]) < 2 or any(o not in shapes for o in dot["operands"][:2]):
    return None
  lhs, rhs = shapes[dot["operands"][0]], shapes[dot["operands"][1]]
  sig = (
    lhs,
    rhs,
    _dims_attr(dot["args"], "lhs_contracting_dims"),
    _dims_attr(dot["args"], "rhs_contracting_dims"),
    _dims_attr(dot["args"], "lhs_batch_dims"),
    _dims_attr(dot["args"], "rhs_batch_dims"),
  )
  k = _prod(lhs[d] for d in sig[2])
  return sig, 2 * _prod(dot["dims"][0]) * k


def gemm_einsum(sig) -> str:
  """The einsum spec of a dot signature (batch dims, then lhs free, then rhs free: XLA's order)."""
  lhs, rhs, lc, rc, lb, rb = sig
  letters = iter("abcdefghijklmnopqrstuvwxyz")
  a = [next(letters) for _ in lhs]
  b = [None] * len(rhs)
  for i, j in zip(lc + lb, rc + rb):
    b[j] = a[i]
  b = [x or next(letters) for x in b]
  out = (
    [a[i] for i in lb]
    + [a[i] for i in range(len(lhs)) if i not in lc + lb]
    + [b[j] for j in range(len(rhs)) if j not in rc + rb]
  )
  return f"{''.join(a)},{''.join(b)}->{''.join(out)}"


def time_gemms(sigs: list, reps: int = 3) -> list[dict]:
  """Each GEMM timed as `jnp.einsum` (jitted) and `torch.einsum` on the same shapes, interleaved,
  best of reps: {einsum, lhs, rhs, jax_gflops, torch_gflops}."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch

  torch.set_num_threads(os.cpu_count())
  out = []
  for sig, flops in sigs:
    spec = gemm_einsum(sig)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(s, dtype=np.float32) for s in sig[:2])
    ja, jb = jnp.asarray(a), jnp.asarray(b)
    f = jax.jit(lambda x, y, spec=spec: jnp.einsum(spec, x, y, precision="highest"))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    f(ja, jb).block_until_ready()
    torch.einsum(spec, ta, tb)
    best = {"jax": float("inf"), "torch": float("inf")}
    for _ in range(reps):
      t0 = time.perf_counter()
      f(ja, jb).block_until_ready()
      best["jax"] = min(best["jax"], time.perf_counter() - t0)
      t0 = time.perf_counter()
      torch.einsum(spec, ta, tb)
      best["torch"] = min(best["torch"], time.perf_counter() - t0)
    out.append(
      {
        "einsum": spec,
        "lhs": list(sig[0]),
        "rhs": list(sig[1]),
        "jax_gflops": flops / best["jax"] / 1e9,
        "torch_gflops": flops / best["torch"] / 1e9,
      }
    )
  return out


def _prod(dims) -> int:
  out = 1
  for d in dims:
    out *= d
  return out


def _fusion_category(comps: dict, name: str) -> str:
  """Category of a fusion by what its fused computation computes (dot > reduce > transpose > copy)."""
  ops = {i["op"] for i in comps.get(name, {}).get("instrs", [])}
  if ops & {"dot", "convolution"}:
    return "dot"
  if ops & {"reduce", "reduce-window"}:
    return "reduce"
  if ops & {"gather", "scatter", "dynamic-slice", "dynamic-update-slice"}:
    return "gather/scatter/slice"
  if ops <= {"parameter", "transpose", "copy", "bitcast", "reshape", "broadcast", "constant"} and "transpose" in ops:
    return "transpose"
  if (
    ops
    <= {
      "parameter",
      "copy",
      "bitcast",
      "reshape",
      "broadcast",
      "slice",
      "concatenate",
      "tuple",
      "get-tuple-element",
      "constant",
    }
    and "copy" in ops
  ):
    return "copy"
  if "transpose" in ops or "copy" in ops:  # elementwise work written out in another layout
    return "elementwise+transpose"
  return "elementwise"


def categorize(comps: dict, param_shapes: set) -> dict[str, dict]:
  """{instruction name: {category, weights (bool), bytes, op}} for every instruction of a
  non-fused computation (entry, while bodies, calls): what the runtime executes as a thunk."""
  fused = {c for comp in comps.values() for i in comp["instrs"] if i["op"] == "fusion" for c in i["calls"]}
  out = {}
  for cname, comp in comps.items():
    if cname in fused:
      continue
    for i in comp["instrs"]:
      op = i["op"]
      if op in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
        continue
      if op == "fusion":
        cat = "dot" if i["library"] else _fusion_category(comps, i["calls"][0] if i["calls"] else "")
      elif op in ("dot", "convolution") or (op == "custom-call" and i["library"]):
        cat = "dot"
      elif op in ("copy", "copy-start", "copy-done"):
        cat = "copy"
      elif op == "transpose":
        cat = "transpose"
      elif op in ("reduce", "reduce-window", "all-reduce", "sort"):
        cat = "reduce"
      elif op in ("gather", "scatter", "dynamic-slice", "dynamic-update-slice", "slice", "concatenate", "pad"):
        cat = "gather/scatter/slice"
      elif op in ("while", "call", "conditional"):
        cat = "control"
      else:
        cat = (
          "elementwise"
          if op
          in (
            "add",
            "multiply",
            "subtract",
            "divide",
            "select",
            "exponential",
            "maximum",
            "minimum",
            "negate",
            "compare",
            "convert",
            "broadcast",
            "iota",
            "log",
          )
          else "other"
        )
      weights = bool(i["dims"]) and all(tuple(d) in param_shapes for d in i["dims"])
      out[i["name"]] = {
        "category": cat,
        "weights": weights,
        "bytes": i["bytes"],
        "op": op,
        "shape": i["dims"][0] if len(i["dims"]) == 1 else i["dims"],
      }
  return out


def hlo_counts(ops: dict) -> dict:
  """Counts and result GiB by category x (weights | activations)."""
  table = collections.defaultdict(lambda: {"count": 0, "gib": 0.0})
  for o in ops.values():
    key = f"{o['category']}/{'weights' if o['weights'] else 'activations'}"
    table[key]["count"] += 1
    table[key]["gib"] += o["bytes"] / 2**30
  return dict(sorted(table.items()))


def trace_times(trace_dir: str, ops: dict) -> tuple[dict, list, float, dict]:
  """Sums the trace's complete ("X") events of HLO thunks by category; returns
  (seconds by category/weights, top ops [(name, seconds, calls, category, shape)], total s,
  {op name: calls})."""
  events = []
  for path in glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True):
    with gzip.open(path) as f:
      events += [e for e in json.load(f).get("traceEvents", []) if e.get("ph") == "X"]
  per_op = collections.defaultdict(lambda: [0.0, 0])
  for e in events:
    name = e.get("name", "")
    if name in ops:
      per_op[name][0] += e.get("dur", 0) / 1e6
      per_op[name][1] += 1
  by_cat = collections.defaultdict(float)
  for name, (sec, _) in per_op.items():
    o = ops[name]
    if o["category"] != "control":  # a while thunk's time includes its body's thunks
      by_cat[f"{o['category']}/{'weights' if o['weights'] else 'activations'}"] += sec
  top = sorted(
    ((n, s, c, ops[n]["category"], ops[n]["shape"]) for n, (s, c) in per_op.items() if ops[n]["category"] != "control"),
    key=lambda r: -r[1],
  )
  return (
    dict(sorted(by_cat.items(), key=lambda kv: -kv[1])),
    top,
    sum(by_cat.values()),
    {n: c for n, (_, c) in per_op.items()},
  )


def profile_variant(name: str, shape: str, framework: str) -> dict:
  import jax
  from flax import nnx

  b, t = (int(x) for x in shape.split("x"))
  variant = framework.split("+", 1)[1] if "+" in framework else ""
  if bench.parse_variant(variant)[2]:
    raise ValueError(f"{framework}: XLA-flag variants need their own process; use bench_train_step for them")
  runner = bench.JaxStep(name, b, t, variant)
  step = FLAGS.steps[0]
  fn, state = runner.fns[step], runner.states[step]
  t0 = time.perf_counter()
  compiled = fn.lower(state, runner.mb).compile()
  compile_s = time.perf_counter() - t0
  params = state.params if hasattr(state, "params") else state
  param_shapes = {
    tuple(x.shape)
    for x in jax.tree.leaves(nnx.state(params) if isinstance(params, nnx.Module) else params)
    if hasattr(x, "shape") and len(x.shape) >= 2
  }
  param_shapes |= {s[::-1] for s in param_shapes}
  text = compiled.as_text()
  if FLAGS.hlo_dir:
    os.makedirs(FLAGS.hlo_dir, exist_ok=True)
    with open(os.path.join(FLAGS.hlo_dir, f"{name}_{shape}_{framework}.hlo.txt".replace("+", "_")), "w") as f:
      f.write(text)
  comps = parse_hlo(text)
  ops = categorize(comps, param_shapes)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  mem = compiled.memory_analysis()
  for _ in range(2):  # compile + warm
    state, m = fn(state, runner.mb)
    jax.block_until_ready(m)
  walls = []
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir)
    for _ in range(FLAGS.repeats):
      t0 = time.perf_counter()
      state, m = fn(state, runner.mb)
      jax.block_until_ready(m)
      walls.append(time.perf_counter() - t0)
    jax.profiler.stop_trace()
    by_cat, top, total, call_counts = trace_times(trace_dir, ops)
  reps = FLAGS.repeats
  gemms = collections.defaultdict(lambda: {"flops": 0, "count": 0, "executor": set()})
  for comp in comps.values():
    for i in comp["instrs"]:
      if i["name"] in ops and ops[i["name"]]["category"] == "dot":
        found = dot_signature(comps, i)
        if found is None:
          continue
        sig, flops = found
        n = max(1.0, call_counts.get(i["name"], 0) / reps)
        g = gemms[sig]
        g["flops"] += flops * n
        g["count"] += n
        g["executor"].add("library" if i["library"] else "xla")
  total_flops = sum(g["flops"] for g in gemms.values())
  biggest = sorted(gemms.items(), key=lambda kv: -kv[1]["flops"])[: FLAGS.top_gemms]
  rates = time_gemms([(sig, g["flops"] / g["count"]) for sig, g in biggest])
  gemm_rows = [
    {**r, "calls_per_step": g["count"], "gflop_per_step": g["flops"] / 1e9, "executor": "+".join(sorted(g["executor"]))}
    for (sig, g), r in zip(biggest, rates)
  ]
  return {
    "model": name,
    "shape": shape,
    "framework": framework,
    "step": step,
    "compile_s": compile_s,
    "wall_s": walls,
    "loss": float(m["actor/pg_loss"]),
    "hlo_counts": hlo_counts(ops),
    "cost_flops": float(cost.get("flops", 0)),
    "cost_bytes_accessed": float(cost.get("bytes accessed", 0)),
    "temp_gib": mem.temp_size_in_bytes / 2**30 if mem else None,
    "thunk_s_per_step": {k: v / reps for k, v in by_cat.items()},
    "thunk_total_s_per_step": total / reps,
    "gemm_gflop_per_step": total_flops / 1e9,
    "gemms": gemm_rows,
    "top_ops": [
      {"name": n, "s_per_step": s / reps, "calls_per_step": c / reps, "category": cat, "shape": shp}
      for n, s, c, cat, shp in top[: FLAGS.top]
    ],
  }


def write(rows: list[dict], machine: dict) -> None:
  root = RESULTS_DIR
  with open(os.path.join(root, FLAGS.profile_out + ".json"), "w") as f:
    json.dump(
      {
        "machine": machine,
        "flags": {
          "models": FLAGS.models,
          "shapes": FLAGS.shapes,
          "frameworks": FLAGS.frameworks,
          "steps": FLAGS.steps,
          "num_layers": FLAGS.num_layers,
          "repeats": FLAGS.repeats,
        },
        "rows": rows,
      },
      f,
      indent=1,
    )
  md = [
    f"# Train-step profile (compiled step, by op category)\n\nMachine: {machine['note']} ({machine['cpu']}); "
    f"load average {machine['load_avg_start'][0]:.1f} -> {machine['load_avg_end'][0]:.1f}. Thunk seconds are sums "
    f"of `jax.profiler` trace events per step (XLA:CPU runs independent thunks on both cores at once, so "
    f"they can exceed the wall). 'weights' = results shaped like a parameter (or its transpose). GEMMs "
    f"that XLA runs itself (executor `xla`, plain `dot` thunks, e.g. the weight gradients with a transposed "
    f"operand) run on its thread pool after their trace event closes, so their time is missing from the "
    f"thunk sums (`dot/weights` is mostly those); the GEMM table times every large GEMM alone instead.\n"
  ]
  for r in rows:
    md.append(
      f"\n## {r['model']} ({FLAGS.num_layers or 'all'} layers) {r['shape']} {r['step']} step, `{r['framework']}`\n\n"
      f"wall per step {', '.join(f'{w:.2f}' for w in r['wall_s'])} s; thunk sum {r['thunk_total_s_per_step']:.2f} s; "
      f"compile {r['compile_s']:.0f} s; XLA temporaries {r['temp_gib']:.2f} GiB; cost analysis "
      f"{r['cost_flops'] / 1e9:.0f} GFLOP, {r['cost_bytes_accessed'] / 2**30:.1f} GiB accessed; loss {r['loss']:.6f}\n"
    )
    md.append("| category | thunk s/step | % of thunk time | HLO ops | result GiB |\n|---|---|---|---|---|")
    keys = sorted(set(r["thunk_s_per_step"]) | set(r["hlo_counts"]), key=lambda k: -r["thunk_s_per_step"].get(k, 0))
    for k in keys:
      s = r["thunk_s_per_step"].get(k, 0.0)
      c = r["hlo_counts"].get(k, {"count": 0, "gib": 0.0})
      md.append(
        f"| {k} | {s:.3f} | {100 * s / max(r['thunk_total_s_per_step'], 1e-12):.1f}% | {c['count']} | {c['gib']:.2f} |"
      )
    md.append(
      f"\nGEMMs: {r['gemm_gflop_per_step']:.0f} GFLOP per step. The largest, each timed alone as `jnp.einsum` "
      "(jitted) and `torch.einsum` on the same shapes in this process (interleaved, best of 3):\n"
    )
    md.append(
      "| einsum | lhs | rhs | executor in the step | calls/step | GFLOP/step | JAX GFLOP/s | torch GFLOP/s | JAX/torch |\n"
      "|---|---|---|---|---|---|---|---|---|"
    )
    for g in r["gemms"]:
      md.append(
        f"| {g['einsum']} | {g['lhs']} | {g['rhs']} | {g['executor']} | {g['calls_per_step']:.0f} | "
        f"{g['gflop_per_step']:.1f} | {g['jax_gflops']:.1f} | {g['torch_gflops']:.1f} | "
        f"{g['jax_gflops'] / g['torch_gflops']:.2f} |"
      )
    md.append("\n| top op | category | shape | s/step | calls/step |\n|---|---|---|---|---|")
    for o in r["top_ops"]:
      md.append(f"| {o['name']} | {o['category']} | {o['shape']} | {o['s_per_step']:.3f} | {o['calls_per_step']:.0f} |")
  with open(os.path.join(root, FLAGS.profile_out + ".md"), "w") as f:
    f.write("\n".join(md) + "\n")


def main(argv):
  del argv
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  load_start = os.getloadavg()
  rows = []
  for name in FLAGS.models:
    for shape in FLAGS.shapes:
      for fw in FLAGS.frameworks:
        if fw == "torch":
          continue
        rows.append(profile_variant(name, shape, fw))
        r = rows[-1]
        print(
          f"{name} {shape} {fw}: wall {r['wall_s']}, thunks {r['thunk_total_s_per_step']:.2f} s "
          f"{json.dumps({k: round(v, 3) for k, v in r['thunk_s_per_step'].items()})}",
          flush=True,
        )
  machine = {
    "cpus": os.cpu_count(),
    "cpu": cpu_name(),
    "load_avg_start": load_start,
    "load_avg_end": os.getloadavg(),
    "note": load_note(load_start[0]),
  }
  write(rows, machine)


if __name__ == "__main__":
  app.run(main)
