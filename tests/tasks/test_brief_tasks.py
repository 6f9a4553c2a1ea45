"""The brief-prompt tasks for SmolLM2's learning runs (tasks/multihop_qa_brief.py,
tasks/webshop_brief.py): their multi-turn scripted demos through the real agent rollout, the
real env servers (retrieval BM25, the shop) and SmolLM2's tokenizer and template, scored by the
tasks' own rewards; the SFT loss mask of those multi-turn demos; and the shop's brief pages."""

from __future__ import annotations

import re

import numpy as np
import pytest

from agentfly_jax.agents import load_tokenizer, run_rollout
from agentfly_jax.agents.trajectory import pad_batch
from agentfly_jax.rl.sft import ScriptedPolicySampler, sft_loss_mask
from agentfly_jax.sampling.protocol import SamplingParams
from agentfly_jax.tasks import get_task, multihop_qa, multihop_qa_brief, multihop_qa_brief_2hop, webshop_brief
from agentfly_jax.tasks.contract import task_spec
from envservers.envs.webshop import Shop, WebShopEnv, webshop_reward

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tok(smollm2_dir):
  return load_tokenizer(smollm2_dir)


def _demo_rollout(tok, task, rows, use_tool, max_turns, max_total_tokens=1024):
  eot = tok.token_to_id("<|im_end|>")
  demo = ScriptedPolicySampler(tok, lambda text, rng: task.scripted_response(text, use_tool, rng), eot)
  trajs = run_rollout(
    task.make_agent(tok),
    rows,
    sampler=demo,
    num_chains=1,
    max_turns=max_turns,
    sampling_params=SamplingParams(temperature=1.0, max_new_tokens=48, stop_token_ids=(eot,)),
    max_tokens_per_turn=48,
    max_total_tokens=max_total_tokens,
    seed=0,
  )
  return trajs, demo


def test_tasks_are_registered():
  assert get_task("multihop_qa_brief") is multihop_qa_brief
  assert get_task("webshop_brief") is webshop_brief
  assert get_task("multihop_qa_brief_2hop") is multihop_qa_brief_2hop


def test_two_hop_task_trains_on_two_hop_rows_only_and_is_otherwise_the_brief_task():
  train = multihop_qa.split_questions()["train"]
  two_hop_questions = {r["question"] for r in train if len(r["hops"]) == 2}
  assert 0 < len(two_hop_questions) < len({r["question"] for r in train})  # the split has 1-hop rows too
  spec, brief = task_spec(multihop_qa_brief_2hop), task_spec(multihop_qa_brief)
  rows = spec.make_rows(400, seed=5)
  assert all(r["question"] in two_hop_questions for r in rows)
  assert {r["type"] for r in rows} == set(multihop_qa_brief.TWO_HOP_TYPES)
  assert rows == spec.make_rows(400, seed=5) and rows != spec.make_rows(400, seed=6)
  assert {r["type"] for r in brief.make_rows(400, seed=5)} >= {"1-hop"}
  assert spec.make_eval_rows(24, 0) == brief.make_eval_rows(24, 0)
  assert (spec.tools, spec.reward, spec.system_prompt) == (brief.tools, brief.reward, brief.system_prompt)
  assert spec.scripted_response is brief.scripted_response and spec.agent_factory is brief.agent_factory


def test_multihop_demo_retrieves_each_hop_and_answers_right(tok):
  rows = multihop_qa.make_rows(12, seed=31)
  assert {r["type"] for r in rows} >= {"1-hop", "2-hop-bridge"}
  trajs, _ = _demo_rollout(tok, multihop_qa_brief, rows, True, max_turns=4)
  for t in trajs:
    calls = [c["name"] for c in t.tool_calls]
    hops = len(t.row["hops"])
    assert calls == ["retrieve"] * hops + ["answer"], (t.row["question"], calls)
    assert t.finish_reason == "finish_tool" and t.reward == 1.0, (t.row, t.prediction)
    text = tok.decode(list(t.token_ids))
    assert text.count('"k": 1') == hops and "Error" not in text


def test_multihop_demo_without_retrieval_guesses_and_the_guess_is_not_learned(tok):
  rows = multihop_qa.make_rows(8, seed=32)
  trajs, demo = _demo_rollout(tok, multihop_qa_brief, rows, False, max_turns=4)
  arr = pad_batch(trajs, pad_id=tok.pad_token_id)
  width = arr["token_ids"].shape[1] - 1
  loss = sft_loss_mask(trajs, demo, width)
  targets, action = arr["token_ids"][:, 1:], arr["action_mask"][:, 1:]
  for i, t in enumerate(trajs):
    assert t.tool_calls == [] and t.finish_reason == "no_tool_call"
    guess = multihop_qa.no_retrieval_answer(t.row)
    assert t.prediction == multihop_qa_brief.GUESS_PREFIX + guess
    dropped = np.flatnonzero(action[i] & ~loss[i])
    assert tok.decode(targets[i, dropped].tolist()) == guess
    assert not (loss[i] & ~action[i]).any()


def test_multihop_multi_turn_demo_loss_mask_is_every_model_turn(tok):
  trajs, demo = _demo_rollout(tok, multihop_qa_brief, multihop_qa.make_rows(6, seed=33), True, max_turns=4)
  arr = pad_batch(trajs, pad_id=tok.pad_token_id)
  loss = sft_loss_mask(trajs, demo, arr["token_ids"].shape[1] - 1)
  np.testing.assert_array_equal(loss, arr["action_mask"][:, 1:])  # all learned, all turns
  for i, t in enumerate(trajs):  # one learned run per model turn, observations between them
    runs = np.flatnonzero(np.diff(np.concatenate([[0], loss[i].astype(int), [0]])) == 1)
    assert len(runs) == len(t.row["hops"]) + 1


def test_parse_instruction_recovers_every_goal():
  rows = webshop_brief.make_rows(300, seed=4) + webshop_brief.make_eval_rows(100, seed=0)
  for row in rows:
    goal, parsed = row["goal"], webshop_brief.parse_instruction(row["question"])
    assert parsed["type"] == goal["query"]
    assert parsed["attributes"] == " and ".join(goal["attributes"])
    assert parsed["options"] == goal["goal_options"]
  assert webshop_brief.parse_instruction("buy me something nice") is None


def test_brief_page_keeps_the_buttons_and_drops_the_repeats():
  import trio

  env = WebShopEnv()
  row = webshop_brief.make_eval_rows(1, seed=0)[0]

  async def pages():
    await env.start()
    await env.reset(row)
    results = (await env.step(f"search[{row['goal']['query']}]")).observation
    item = (await env.step(f"click[{env._page_results()[0]['asin'].lower()}]")).observation
    return results, item

  results, item = trio.run(pages)
  brief_results, brief_item = webshop_brief.brief_page(results), webshop_brief.brief_page(item)
  for full, brief in ((results, brief_results), (item, brief_item)):
    assert "Instruction:" in full and "Available actions:" in full
    assert "Instruction:" not in brief and "Available actions:" not in brief
  shown = webshop_brief._RESULT.findall(brief_results)
  assert shown == webshop_brief._RESULT.findall(results)[: webshop_brief.RESULTS_SHOWN]
  for name, values in env.item["options"].items():
    assert all(f"[{v}]" in brief_item for v in values)
  assert "[Buy Now]" in brief_item


def _plan_reward(shop: Shop, goal: dict, look_past: bool) -> float:
  """Reference: the demo's plan scored by the WebShop reward directly (no server, no agent): the
  first of the top `LOOK_PAST` hits whose page shows every asked option value (else the last one
  looked at; without looking past, the top hit), with the asked values its page shows picked."""
  parsed = webshop_brief.parse_instruction(goal["instruction_text"])
  query = " ".join(x for x in (parsed["type"], parsed["attributes"]) if x)
  hits = shop.search(query)[: webshop_brief.LOOK_PAST if look_past else 1]
  shows_all = [p for p in hits if all(v in sum(p["options"].values(), []) for v in goal["goal_options"].values())]
  product = shows_all[0] if shows_all else hits[-1]
  options = {name: v for name, v in goal["goal_options"].items() if v in sum(product["options"].values(), [])}
  return webshop_reward(product, goal, options)["reward"]


@pytest.mark.parametrize("look_past", [True, False])
def test_webshop_demo_through_the_server_scores_as_its_plan(tok, look_past):
  rows = webshop_brief.make_eval_rows(10, seed=0)
  trajs, _ = _demo_rollout(tok, webshop_brief, rows, look_past, max_turns=8, max_total_tokens=1536)
  shop = Shop(webshop_brief.catalog())
  expected = [_plan_reward(shop, r["goal"], look_past) for r in rows]
  got = [t.reward for t in trajs]
  np.testing.assert_allclose(got, expected, atol=1e-6)
  successes = sum(g >= 1.0 - 1e-9 for g in got)
  assert [t.reward_metrics["success"] for t in trajs] == [float(g >= 1.0 - 1e-9) for g in expected]
  assert 1 <= successes < len(rows)
  backs = [tok.decode(list(t.token_ids)).count("click[< prev]") for t in trajs]
  if look_past:
    assert 1 <= sum(backs) and max(backs) <= webshop_brief.LOOK_PAST - 1  # it looked past a hit, and no further
  else:
    assert sum(backs) == 0
  picks = [len(re.findall(r"click\[(?!B0|< prev|buy now)", tok.decode(list(t.token_ids)))) for t in trajs]
  assert sum(picks) >= 1  # option values picked either way
  for t in trajs:
    assert t.finish_reason == "env_done"  # the purchase ends the episode, and the chain with it
    assert t.tool_calls[-1]["arguments"] == {"action": "click[buy now]"}
    assert "Thank you for shopping" in str(t.messages[-1]["content"])  # the last observation, kept for transcripts
    assert tok.decode(list(t.token_ids)).count(t.row["question"]) == 1  # the first page's copy dropped
    assert "Invalid action" not in tok.decode(list(t.token_ids))


@pytest.mark.parametrize(
  "name, task, tools",
  [
    ("smollm2_multihop_sft_grpo", multihop_qa_brief, ["retrieve", "answer"]),
    ("smollm2_multihop_2hop_sft_grpo", multihop_qa_brief_2hop, ["retrieve", "answer"]),
    ("smollm2_webshop_sft_grpo", webshop_brief, ["shop"]),
  ],
)
def test_learning_run_configs_are_valid_and_name_their_task(name, task, tools):
  import importlib.util
  import os

  from agentfly_jax.rl.config import validate_config
  from train_cli import ROOT

  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  validate_config(config)
  assert get_task(config.task) is task and [t.name for t in task.TOOLS] == tools
  assert config.sft.steps > 0 and 0 < config.sft.tool_use_prob <= 1 and config.model.lora.rank > 0
  assert config.eval.num_rows == 24 and config.model.pretrained
