"""Every run default is written once, in rl/spec.py (issue #43): a numeric default of a library
signature (a function parameter or a dataclass field in agentfly_jax/) named like a run-config field
must equal the spec's default for that field. Where a name means something else there, the place is
listed in DIFFERENT_MEANING with why; a listed place that agrees again (or is gone) fails too, so the
list only shrinks."""

import ast
import dataclasses
import os

from train_cli import ROOT

from agentfly_jax.rl import spec as run_spec

# The random-init model's shape (ModelSection): a tiny demo model, not a default of the model code.
MODEL_SHAPE_FIELDS = (
  "family",
  "hidden_size",
  "num_layers",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "intermediate_size",
  "vocab_size",
  "num_experts",
  "num_experts_per_tok",
  "moe_intermediate_size",
)

# "path:function:parameter" -> why its default differs from the spec's field of that name.
DIFFERENT_MEANING = {
  "agentfly_jax/rl/core/losses.py:gspo_policy_loss:clip_low": "GSPO's sequence-level ratio range (paper: 3e-4)",
  "agentfly_jax/rl/core/losses.py:gspo_policy_loss:clip_high": "GSPO's sequence-level ratio range (paper: 4e-4)",
  "agentfly_jax/models/lora.py:LoRAConfig:rank": "an adapter's rank when LoRA is on (spec: 0 = LoRA off)",
  "agentfly_jax/rl/scale/memory_plan.py:RunSizes:attention_chunk": "a plan's input (0 = unchunked); plans pass the run's",
  "agentfly_jax/rl/config.py:tpu_grpo_config:max_total_tokens": "a preset's own value (TPU configs)",
  "agentfly_jax/rl/config.py:tpu_grpo_config:micro_batch_size": "a preset's own value (TPU configs)",
  # The agents' limits outside a run (agent.rollout, run_rollout, the endpoint, load_sampler called directly):
  # one home, agents/standalone_limits.py; the signatures default to STANDALONE.<field>. A run passes the
  # spec's rollout.* values.
  "agentfly_jax/agents/standalone_limits.py:StandaloneLimits:num_chains": "outside a run: one chain per row",
  "agentfly_jax/agents/standalone_limits.py:StandaloneLimits:max_turns": "outside a run: a real model's task",
  "agentfly_jax/agents/standalone_limits.py:StandaloneLimits:max_tokens_per_turn": "outside a run: a real model's turn",
  "agentfly_jax/agents/standalone_limits.py:StandaloneLimits:max_total_tokens": "outside a run: a real model's context",
  "agentfly_jax/agents/standalone_limits.py:StandaloneLimits:max_batch_size": "outside a run: load_sampler's batch",
  "agentfly_jax/sampling/jax_sampler.py:__init__:max_batch_size": "a JaxSampler outside a run",
  "agentfly_jax/tasks/lookup_agent.py:run:max_turns": "the example endpoint agent's own loop bound",
}


def spec_defaults() -> dict[str, set]:
  """Field name -> the spec's numeric defaults under that name (any section; model shape left out)."""
  out: dict[str, set] = {}
  for section in (*run_spec.SECTIONS.values(), run_spec.LoraSection):
    for f in dataclasses.fields(section):
      numeric = isinstance(f.default, (int, float)) and not isinstance(f.default, bool)
      if numeric and not (section is run_spec.ModelSection and f.name in MODEL_SHAPE_FIELDS):
        out.setdefault(f.name, set()).add(f.default)
  return out


def _numeric(node) -> bool:
  return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool)


def library_defaults(tree: ast.AST):
  """(owner name, parameter or field name, value) of every numeric default in a module."""
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      a = node.args
      positional = a.posonlyargs + a.args
      pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults))
      pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
      yield from ((node.name, arg.arg, d.value) for arg, d in pairs if _numeric(d))
    elif isinstance(node, ast.ClassDef):
      for st in node.body:
        if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and _numeric(st.value):
          yield node.name, st.target.id, st.value.value


def disagreements() -> dict[str, str]:
  """ "path:owner:name" -> "default X, spec Y" for every library default that differs from the spec."""
  known, out = spec_defaults(), {}
  library = os.path.join(ROOT, "agentfly_jax")
  for folder, _, files in os.walk(library):
    for name in sorted(files):
      path = os.path.join(folder, name)
      rel = os.path.relpath(path, ROOT)
      if not name.endswith(".py") or rel == "agentfly_jax/rl/spec.py":
        continue
      with open(path) as f:
        tree = ast.parse(f.read())
      for owner, field, value in library_defaults(tree):
        if field in known and value not in known[field]:
          out[f"{rel}:{owner}:{field}"] = f"default {value!r}, spec {sorted(known[field])}"
  return out


def test_library_defaults_agree_with_the_spec():
  found = disagreements()
  new = {k: v for k, v in found.items() if k not in DIFFERENT_MEANING}
  assert not new, (
    "a library default differs from rl/spec.py's (write it once, in the spec; or list it in "
    f"DIFFERENT_MEANING with why): {new}"
  )
  stale = sorted(set(DIFFERENT_MEANING) - set(found))
  assert not stale, f"agree with the spec now (or are gone): remove from DIFFERENT_MEANING: {stale}"


def test_the_check_sees_a_disagreeing_default():
  tree = ast.parse("def f(*, clip_high: float = 0.2, flag=True):\n  pass\nclass C:\n  logits_chunk: int = 128\n")
  assert sorted(library_defaults(tree)) == [("C", "logits_chunk", 128), ("f", "clip_high", 0.2)]
  assert 0.2 not in spec_defaults()["clip_high"]
