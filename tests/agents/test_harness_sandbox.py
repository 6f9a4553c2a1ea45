"""An outside harness in its bubblewrap sandbox (agents/harness_sandbox.py; real bwrap, real subprocesses, the
real endpoint on loopback): its environment holds only what it is given, its /proc shows no other chain (so
no other chain's key), its network reaches only its endpoint, its key is refused from anywhere but its own
sandbox, and host files outside its mounts (the envservers data among them) are not there. Each check is
also run unsandboxed where that shows the check can fail."""

import json
import os
import socket
import sys

import openai
import pytest
import trio

import agentfly_jax
from agentfly_jax.agents import load_tokenizer
from agentfly_jax.agents.endpoint import ChatEndpoint, serve_endpoint
from agentfly_jax.agents.endpoint_rollout import run_endpoint_rollout
from agentfly_jax.agents.harness import command_agent
from agentfly_jax.agents.harness_sandbox import source_host
from agentfly_jax.sampling.scripted import ScriptedSampler
from agentfly_jax.tasks import Task, lookup

from endpoint_testlib import WARMSTART, lookup_script
from envservers_helpers import sandbox_unavailable_reason

pytestmark = pytest.mark.skipif(sandbox_unavailable_reason() is not None, reason=str(sandbox_unavailable_reason()))

HOSTILE = os.path.join(os.path.dirname(__file__), "harness_hostile.py")
REPO = os.path.dirname(os.path.dirname(agentfly_jax.__file__))
SWE_TASK = os.path.join(REPO, "envservers", "data", "swe_tasks", "train", "inventory-broken_import-0.json")


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer(WARMSTART)


@pytest.fixture(scope="module")
def agent(tok):
  return lookup.make_agent(tok)


def _answers(tok, agent, words, rows=None, **kwargs):
  """The harness's answers (its stdout as JSON), one per row."""
  rows = rows or lookup.make_rows(1, 0)
  fn = command_agent([sys.executable, HOSTILE, *words], **kwargs)
  trajs = run_endpoint_rollout(agent, rows, fn, sampler=ScriptedSampler(lookup_script(tok)), chain_timeout_s=60)
  assert all(t.finish_reason == "agent_done" for t in trajs), [t.error for t in trajs]
  return [json.loads(t.prediction) for t in trajs]


def test_its_environment_holds_only_what_it_is_given(tok, agent, monkeypatch):
  monkeypatch.setenv("AGENTFLY_TEST_TRAINER_SECRET", "s3cret")
  monkeypatch.setenv("AGENTFLY_TEST_GIVEN", "given")
  [got] = _answers(tok, agent, ["env"], env_names=["AGENTFLY_TEST_GIVEN", "AGENTFLY_TEST_UNSET"])
  given = {"OPENAI_BASE_URL", "OPENAI_API_KEY", "AGENTFLY_ROW", "PATH", "HOME", "AGENTFLY_TEST_GIVEN"}
  # (PWD: set by bwrap's --chdir; LC_CTYPE: Python's own C-locale coercion, PEP 538, in the sandbox's empty locale)
  assert set(got["env"]) - {"PWD", "LC_CTYPE"} == given, sorted(got["env"])
  assert got["env"]["AGENTFLY_TEST_GIVEN"] == "given" and got["status"] == 200
  [host] = _answers(tok, agent, ["env"], sandbox="off")  # on the host: the trainer's whole environment
  assert host["env"]["AGENTFLY_TEST_TRAINER_SECRET"] == "s3cret"


@pytest.mark.parametrize("sandbox", ["bwrap", "off"])
def test_no_other_chain_s_key_is_visible_in_its_proc(tok, agent, sandbox):
  rows = [dict(r, linger=2.0) for r in lookup.make_rows(3, 0)]  # three harnesses alive at once
  answers = _answers(tok, agent, ["proc"], rows=rows, sandbox=sandbox)
  stolen = [set(a["keys"]) - {a["own"]} for a in answers]
  if sandbox == "off":  # the leak the sandbox closes: a harness reads its siblings' keys from /proc
    assert any(stolen), stolen
    return
  assert stolen == [set(), set(), set()]
  assert all(len(a["pids"]) < 10 for a in answers), [a["pids"] for a in answers]


def test_its_network_reaches_only_its_endpoint(tok, agent):
  other = socket.socket()
  other.bind(("127.0.0.1", 0))
  other.listen()
  port = other.getsockname()[1]
  try:
    [inside] = _answers(tok, agent, ["reach", str(port)])
    [host] = _answers(tok, agent, ["reach", str(port)], sandbox="off")
  finally:
    other.close()
  assert inside == {"other": False, "endpoint": True}
  assert host == {"other": True, "endpoint": True}


@pytest.mark.trio
async def test_its_key_is_refused_from_anywhere_but_its_own_sandbox(tok, agent):
  endpoint = ChatEndpoint(agent, ScriptedSampler(lookup_script(tok)), max_tokens_per_turn=64, max_total_tokens=512)
  mine, theirs = endpoint.open_chain(0, 0), endpoint.open_chain(0, 1)
  endpoint.bind_chain(theirs, source_host())  # the other chain's harness runs in a sandbox of its own
  harness = command_agent([sys.executable, HOSTILE, "steal"])
  row = {"question": 'Find the code of key "fox".', "other_key": theirs}
  async with serve_endpoint(endpoint) as base_url:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=mine, max_retries=0)
    with trio.fail_after(60):
      answer = json.loads(await harness(client, row, bind=lambda host: endpoint.bind_chain(mine, host)))
    with pytest.raises(openai.AuthenticationError, match="bound to its own sandbox"):  # its key, from the host
      await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
  assert answer == {"own": 200, "stolen": 401}
  assert endpoint.chains[mine].num_requests == 1 and endpoint.chains[theirs].num_requests == 0


def test_host_files_outside_its_mounts_are_not_there(tok, agent, tmp_path):
  secret = tmp_path / "rows_with_answers.json"
  secret.write_text('{"answer": "amber"}')
  [inside] = _answers(tok, agent, ["read", str(secret)])
  assert inside == {"error": "FileNotFoundError"}
  [host] = _answers(tok, agent, ["read", str(secret)], sandbox="off")
  assert host == {"read": '{"answer": "amber"}'}
  # the repository shown (e.g. for its agentfly_jax): the envservers data (hidden tests, fixes) stays sealed
  assert os.path.isfile(SWE_TASK)
  [sealed] = _answers(tok, agent, ["read", SWE_TASK], mounts=[REPO])
  assert sealed == {"error": "FileNotFoundError"}


def test_bad_sandbox_settings_are_named(tmp_path):
  rows = lookup.make_rows(1, 0)
  with pytest.raises(ValueError, match="Task.agent_cmd: agent_sandbox='docker': must be one of"):
    Task(reward=lookup.code_match, rows=rows, agent_cmd=[sys.executable, HOSTILE], agent_sandbox="docker")
  with pytest.raises(ValueError, match="Task.agent_cmd: agent_mounts: '/no/such/dir' is not a folder"):
    Task(reward=lookup.code_match, rows=rows, agent_cmd=[sys.executable, HOSTILE], agent_mounts=["/no/such/dir"])
  with pytest.raises(ValueError, match="Task.agent_cmd: agent_env: 'A=1' is not a variable name"):
    Task(reward=lookup.code_match, rows=rows, agent_cmd=[sys.executable, HOSTILE], agent_env=["A=1"])
  from agentfly_jax.rl.config import default_config
  from agentfly_jax.tasks.from_config import build_task, set_custom_task

  config = set_custom_task(
    default_config(), module="agentfly_jax.tasks.lookup", agent_cmd=f"{sys.executable} {HOSTILE}"
  )
  config.task.agent_sandbox = "none"
  with pytest.raises(ValueError, match="config.task.agent_sandbox='none': must be 'bwrap' or 'off'"):
    build_task(config)
  config.task.agent_sandbox, config.task.agent_env, config.task.agent_mounts = "bwrap", "HOME, LANG", str(tmp_path)
  fn = build_task(config).agent_fn
  assert (fn.sandbox, fn.command) == ("bwrap", [sys.executable, HOSTILE])
