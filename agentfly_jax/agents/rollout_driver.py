"""The one rollout driver: the argument check and the chain start / collection shared by every chain runner.

  check_chain_args("rollout", num_chains=4, max_turns=4, concurrency=256, tool_threads=128)
  results = await drive_chains(rows, num_chains, run_chain, concurrency=256, group_offset=0)

`run_chain(row, group_id, chain_id)` is the chain runner: the built-in multi-turn loop
(`rollout._run_chain`) or a black-box agent's chain against the endpoint (`endpoint_rollout._run_chain`).
The driver starts `num_chains` chains per row in one trio nursery, at most `concurrency` at once,
group_id = group_offset + row index, chain_id = 0 .. num_chains - 1, and returns their results
row-major (`[row0 chain0, row0 chain1, ..., row1 chain0, ...]`). A runner never raises for its
chain's own failure (it returns a trajectory saying so); an exception that escapes it is the rollout's.
`on_group(results) -> results` (optional) gets a group's `num_chains` results as soon as its last chain ends,
outside the chain limiter (a group reward: rewards/judge.py), while other groups still run.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Sequence

import trio

ChainRunner = Callable[[dict, int, int], Awaitable[Any]]


def check_chain_args(caller: str, *, num_chains, max_turns, concurrency, tool_threads, **limits) -> None:
  """Every count must be an int >= 1; raises ValueError naming `caller` and the argument. Checked in
  the order num_chains, max_turns, the runner's own `limits`, concurrency, tool_threads."""
  counts = {"num_chains": num_chains, "max_turns": max_turns, **limits}
  counts.update(concurrency=concurrency, tool_threads=tool_threads)
  for name, value in counts.items():
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{caller}: {name} must be an int >= 1, got {value!r}")


async def drive_chains(
  rows: Sequence[dict],
  num_chains: int,
  run_chain: ChainRunner,
  *,
  concurrency: int | trio.CapacityLimiter,
  group_offset: int = 0,
  on_group: Callable[[list], Awaitable[list]] | None = None,
) -> list:
  """Runs `run_chain(row, group_offset + g, c)` for every row g and chain c concurrently; returns the
  results row-major. `concurrency`: how many chains run at once, or a limiter shared with other calls.
  `on_group`: see the module docstring."""
  limiter = concurrency if isinstance(concurrency, trio.CapacityLimiter) else trio.CapacityLimiter(concurrency)
  results: list = [None] * (len(rows) * num_chains)
  pending = [num_chains] * len(rows)

  async def chain(index, row, group_id, chain_id):
    async with limiter:
      results[index] = await run_chain(row, group_id, chain_id)
    g = index // num_chains
    pending[g] -= 1
    if on_group is not None and pending[g] == 0:  # the group's last chain: its group reward, here
      start = g * num_chains
      results[start : start + num_chains] = await on_group(results[start : start + num_chains])

  async with trio.open_nursery() as nursery:
    for g, row in enumerate(rows):
      for c in range(num_chains):
        nursery.start_soon(chain, g * num_chains + c, row, group_offset + g, c)
  return results
