"""The agents' limits when they run outside a training run, written once: `agent.rollout(...)` in a
notebook, `run_rollout` / `run_endpoint_rollout` / `ChatEndpoint` called directly, a sampler loaded
for a real HF model (`load_sampler`). Their signatures default to `STANDALONE.<field>`.

A training run never uses these: it passes its spec's rollout.* values (rl/spec.RolloutSection),
whose defaults are sized for the tiny demo policy (a 256-token context); these are sized for a real
model's turns and context, one chain per row.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class StandaloneLimits:
  num_chains: int = 1  # one chain per row
  max_turns: int = 4
  max_tokens_per_turn: int = 256  # a real model's turn
  max_total_tokens: int = 2048  # a real model's context
  max_batch_size: int = 32  # a sampler's batch (load_sampler)
  chain_timeout_s: float = 600.0  # a chain's wall-clock limit (finish "timeout"); a chain always has one
  endpoint_max_body_bytes: int = 4_194_304  # the endpoint's largest request body (413 beyond it)


STANDALONE = StandaloneLimits()
