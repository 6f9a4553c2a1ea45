"""Concurrent trio requests are gathered into batches; each caller gets its own result."""

import threading
import time

import pytest
import trio

from agentfly_jax.sampling import BatchingScheduler, JaxSampler, SamplingParams
from sampler_testing import make_model, reference_greedy


class RecordingBatchFn:
  """A real batch function: echoes each prompt with its param, records batches and threads."""

  def __init__(self, delay_s: float = 0.0, fail_on: int | None = None):
    self.batches, self.threads, self.delay_s, self.fail_on = [], set(), delay_s, fail_on

  def __call__(self, prompts, params_list):
    self.threads.add(threading.get_ident())
    self.batches.append([p[0] for p in prompts])
    time.sleep(self.delay_s)
    if self.fail_on is not None and any(p[0] == self.fail_on for p in prompts):
      raise RuntimeError(f"engine failed on a batch holding {self.fail_on}")
    return [(p[0], params) for p, params in zip(prompts, params_list)]


@pytest.mark.trio
async def test_many_concurrent_requests_are_batched_and_each_gets_its_own_result():
  fn = RecordingBatchFn(delay_s=0.05)
  sched = BatchingScheduler(fn, max_batch_size=4, max_wait_s=0.02)
  results = {}

  async def chain(i):
    results[i] = await sched.submit([i, 100 + i], f"params-{i}")

  async with trio.open_nursery() as nursery:
    for i in range(10):
      nursery.start_soon(chain, i)
  assert results == {i: (i, f"params-{i}") for i in range(10)}
  assert max(sched.batch_sizes) > 1 and max(sched.batch_sizes) <= 4
  assert sum(sched.batch_sizes) == 10
  assert sorted(x for b in fn.batches for x in b) == list(range(10))
  assert threading.get_ident() not in fn.threads  # ran in a worker thread


@pytest.mark.trio
async def test_requests_arriving_during_a_batch_form_the_next_batch():
  fn = RecordingBatchFn(delay_s=0.3)
  sched = BatchingScheduler(fn, max_batch_size=8, max_wait_s=0.0)
  ticks = []

  async def ticker():  # the trio loop keeps running while a batch is in the thread
    for _ in range(5):
      ticks.append(trio.current_time())
      await trio.sleep(0.02)

  async with trio.open_nursery() as nursery:
    nursery.start_soon(sched.submit, [0], None)
    await trio.sleep(0.05)
    nursery.start_soon(ticker)
    for i in range(1, 6):
      nursery.start_soon(sched.submit, [i], None)
  assert [sorted(b) for b in fn.batches] == [[0], [1, 2, 3, 4, 5]]
  assert len(ticks) == 5 and ticks[-1] - ticks[0] < 0.3


@pytest.mark.trio
async def test_a_bad_request_fails_only_its_caller():
  def validate(prompt, params):
    if not prompt:
      raise ValueError("agenerate request: prompt is empty")

  sched = BatchingScheduler(RecordingBatchFn(), max_batch_size=4, validate=validate)
  outcomes = {}

  async def chain(i, prompt):
    try:
      outcomes[i] = await sched.submit(prompt, None)
    except ValueError as e:
      outcomes[i] = str(e)

  async with trio.open_nursery() as nursery:
    nursery.start_soon(chain, 0, [7])
    nursery.start_soon(chain, 1, [])
    nursery.start_soon(chain, 2, [9])
  assert outcomes == {0: (7, None), 1: "agenerate request: prompt is empty", 2: (9, None)}


@pytest.mark.trio
async def test_an_engine_error_reaches_its_batch_and_the_scheduler_recovers():
  sched = BatchingScheduler(RecordingBatchFn(fail_on=3), max_batch_size=2, max_wait_s=0.01)
  outcomes = {}

  async def chain(i):
    try:
      outcomes[i] = await sched.submit([i], None)
    except RuntimeError as e:
      outcomes[i] = str(e)

  async with trio.open_nursery() as nursery:
    for i in (3, 4):
      nursery.start_soon(chain, i)
  assert outcomes == {3: "engine failed on a batch holding 3", 4: "engine failed on a batch holding 3"}
  assert await sched.submit([5], "p") == (5, "p")


@pytest.mark.trio
async def test_a_cancelled_pending_request_is_dropped():
  fn = RecordingBatchFn(delay_s=0.2)
  sched = BatchingScheduler(fn, max_batch_size=8, max_wait_s=0.0)
  async with trio.open_nursery() as nursery:
    nursery.start_soon(sched.submit, [0], None)
    await trio.sleep(0.05)  # batch [0] is running
    with trio.move_on_after(0.05):
      await sched.submit([1], None)  # cancelled while waiting for the engine
    nursery.start_soon(sched.submit, [2], None)
  assert fn.batches == [[0], [2]]


def test_one_scheduler_serves_successive_trio_runs():
  sched = BatchingScheduler(RecordingBatchFn(), max_batch_size=2)
  assert trio.run(sched.submit, [1], "a") == (1, "a")
  assert trio.run(sched.submit, [2], "b") == (2, "b")


def test_bad_scheduler_settings():
  with pytest.raises(ValueError, match="max_batch_size"):
    BatchingScheduler(RecordingBatchFn(), max_batch_size=0)
  with pytest.raises(ValueError, match="max_wait_s"):
    BatchingScheduler(RecordingBatchFn(), max_batch_size=1, max_wait_s=-1)


@pytest.mark.trio
async def test_jax_sampler_agenerate_batches_concurrent_chains():
  model = make_model(seed=4)
  sampler = JaxSampler(model, max_batch_size=8, max_len=64, batch_buckets=(8,), max_wait_s=0.05)
  prompts = [[i + 1, (7 * i) % 90 + 2, 33] for i in range(12)]
  greedy = [SamplingParams(temperature=0.0, max_new_tokens=3 + i % 4) for i in range(6)]
  sampled = [SamplingParams(temperature=0.9, max_new_tokens=6, seed=100 + i) for i in range(6)]
  params = greedy + sampled
  results = [None] * 12

  async def chain(i):
    results[i] = await sampler.agenerate(prompts[i], params[i])

  async with trio.open_nursery() as nursery:
    for i in range(12):
      nursery.start_soon(chain, i)
  assert max(sampler.scheduler.batch_sizes) > 1
  assert sum(sampler.scheduler.batch_sizes) == 12
  for i in range(6):  # greedy callers: their own prompt's greedy continuation, their own length
    assert results[i].token_ids == reference_greedy(model, prompts[i], 3 + i % 4)
  sync = sampler.generate(prompts[6:], sampled)  # seeded callers: the same as a sync call
  for got, want in zip(results[6:], sync):
    assert got.token_ids == want.token_ids
  with pytest.raises(ValueError, match="agenerate request: prompt is empty"):
    await sampler.agenerate([], greedy[0])
