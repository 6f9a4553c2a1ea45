"""The JAX sampler's multi-turn prefix cache: a rollout's turns with it on vs off, same process.

  .venv/bin/python lab/bench/bench_prefix_cache.py --chains=16 --turns=6
  -> lab/results/bench_prefix_cache.{json,md}

A random-init SmolLM2-135M (its architecture, float32) plays `--chains` chains of `--turns` turns:
turn 1's prompt is `--system` tokens (shared by all chains, as a system prompt and task are) plus
`--task` tokens of the chain's own; each next prompt is the last prompt + the reply (greedy, up
to `--reply` tokens) + `--obs` tokens of observation (a tool's page). Every turn is one
`generate` call over all chains (a synchronous rollout's batch). Each configuration plays the
whole rollout once untimed (compiles), then `--repeats` timed times, interleaved on / off so
drift hits both. Greedy replies of the two must be equal (checked), so both do the same work.
"""

import os
import sys
import time

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import RESULTS_DIR, SMOLLM2_135M_SHAPES
from bench_machine import machine, write_results

_CHAINS = flags.DEFINE_integer("chains", 16, "Chains (rows per generate call).")
_TURNS = flags.DEFINE_integer("turns", 6, "Turns per chain.")
_SYSTEM = flags.DEFINE_integer("system", 200, "Shared prompt tokens (system prompt + tools).")
_TASK = flags.DEFINE_integer("task", 60, "Each chain's own first-turn tokens.")
_REPLY = flags.DEFINE_integer("reply", 32, "Most tokens a reply takes (greedy).")
_OBS = flags.DEFINE_integer("obs", 150, "Observation tokens appended each turn.")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed rollouts per configuration.")
_LAYERS = flags.DEFINE_integer("layers", 30, "Decoder layers of the SmolLM2-135M-shaped model (SmolLM2's 30).")
_VOCAB = flags.DEFINE_integer("vocab_size", 0, "Vocabulary (0 = SmolLM2's 49,152); prompt ids are drawn below it.")


def _top_id() -> int:
  """The prompts' token ids are drawn in [10, this)."""
  return min(40000, _VOCAB.value or 40000)


_OUT = flags.DEFINE_string("out", os.path.join(RESULTS_DIR, "bench_prefix_cache"), "Output path (no extension).")


def rollout(sampler, rng_seed: int) -> tuple[float, list, int]:
  """Plays every chain's turns; returns (seconds, replies, prompt tokens over all calls)."""
  from agentfly_jax.sampling import SamplingParams

  rng = np.random.default_rng(rng_seed)
  system = rng.integers(10, _top_id(), size=_SYSTEM.value).tolist()
  prompts = [system + rng.integers(10, _top_id(), size=_TASK.value).tolist() for _ in range(_CHAINS.value)]
  params = SamplingParams(temperature=0.0, max_new_tokens=_REPLY.value)
  replies, prompt_tokens, t0 = [], 0, time.perf_counter()
  for _ in range(_TURNS.value):
    results = sampler.generate(prompts, params)
    prompt_tokens += sum(map(len, prompts))
    replies.append([r.token_ids for r in results])
    prompts = [
      p + r.token_ids + rng.integers(10, _top_id(), size=_OBS.value).tolist() for p, r in zip(prompts, results)
    ]
  return time.perf_counter() - t0, replies, prompt_tokens


def main(_):
  import jax
  from flax import nnx

  from agentfly_jax.models import CausalLM, ModelConfig
  from agentfly_jax.sampling import JaxSampler

  shapes = {**SMOLLM2_135M_SHAPES, "num_hidden_layers": _LAYERS.value}
  cfg = ModelConfig(**{**shapes, **({"vocab_size": _VOCAB.value} if _VOCAB.value else {})})
  model = CausalLM(cfg, rngs=nnx.Rngs(0))
  longest = _SYSTEM.value + _TASK.value + _TURNS.value * (_REPLY.value + _OBS.value)
  max_len = 1 << (longest - 1).bit_length()
  samplers = {
    "off": JaxSampler(model, max_batch_size=_CHAINS.value, max_len=max_len),
    "on": JaxSampler(model, max_batch_size=_CHAINS.value, max_len=max_len, prefix_cache_tokens=_CHAINS.value * max_len),
  }
  times = {name: [] for name in samplers}
  replies = {}
  for name, s in samplers.items():  # untimed: compiles every shape the rollout meets
    _, replies[name], prompt_tokens = rollout(s, 0)
    if name == "on":
      s.prefix_store.clear()
  if replies["on"] != replies["off"]:
    raise AssertionError("greedy replies differ with the prefix cache on")
  for _ in range(_REPEATS.value):
    for name, s in samplers.items():
      seconds, _, _ = rollout(s, 0)
      times[name].append(seconds)
      if name == "on":
        s.prefix_store.clear()
  stats = samplers["on"].prefix_store.stats
  runs = 1 + _REPEATS.value
  off, on = min(times["off"]), min(times["on"])
  result = {
    "machine": machine(),
    "jax": jax.__version__,
    "model": f"SmolLM2-135M shape ({_LAYERS.value} layers, vocabulary {cfg.vocab_size}), random init, float32",
    "chains": _CHAINS.value,
    "turns": _TURNS.value,
    "tokens": {"system": _SYSTEM.value, "task": _TASK.value, "reply": _REPLY.value, "obs": _OBS.value},
    "prompt_tokens_per_rollout": prompt_tokens,
    "prefilled_tokens_per_rollout_on": stats.prefilled_tokens // runs,
    "seconds_off": times["off"],
    "seconds_on": times["on"],
    "speedup": off / on,
  }
  md = (
    f"# JAX sampler prefix cache: a {_TURNS.value}-turn rollout of {_CHAINS.value} chains\n\n"
    f"{machine()}, jax {jax.__version__}; {result['model']}; prompts: {_SYSTEM.value} shared + "
    f"{_TASK.value} own tokens, then + a greedy reply (<= {_REPLY.value}) + {_OBS.value} observation "
    f"tokens a turn. Best of {_REPEATS.value} timed rollouts each, interleaved, after an untimed one.\n\n"
    "| prefix cache | rollout s | prompt tokens prefilled | speedup |\n|---|---|---|---|\n"
    f"| off | {off:.1f} | {prompt_tokens} | 1.00 |\n"
    f"| on | {on:.1f} | {result['prefilled_tokens_per_rollout_on']} | {off / on:.2f} |\n\n"
    "Greedy replies are equal with and without it (checked). Command: "
    f"`python lab/bench/bench_prefix_cache.py --chains={_CHAINS.value} --turns={_TURNS.value} --repeats={_REPEATS.value}`\n"
  )
  write_results(_OUT.value, result, md)


if __name__ == "__main__":
  app.run(main)
