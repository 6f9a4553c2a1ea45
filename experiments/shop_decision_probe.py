"""The shop's look-past decision, measured: T=1 chains of a `webshop_brief` run's checkpoint on training
rows (a group's chains share their first `rollout.shared_turns` turns); at each chain's third model turn
(the first product page) the policy's probability of the whole `click[< prev]` call, whether the page
lacks an asked option value, and the action the chain took. Written to --out as JSON.

  PYTHONPATH=$PWD .venv/bin/python experiments/shop_decision_probe.py --workdir=runs/smol_webshop_sft0 --step=0 \
      --rows=8 --chains=4 --out=experiments/results/smollm2_webshop/attempts/q_decision_probe_sft.json
"""

import collections
import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax.numpy as jnp
import numpy as np
from flax import nnx
from absl import app, flags

W = flags.DEFINE_string("workdir", None, "A train.py run directory of task webshop_brief.", required=True)
STEP = flags.DEFINE_integer("step", 0, "Checkpoint step.")
N = flags.DEFINE_integer("rows", 8, "Rows (groups).")
CH = flags.DEFINE_integer("chains", 4, "Chains per row.")
BT = flags.DEFINE_float("branch_temperature", 0.0, "rollout.branch_temperature (0 = off).")
SPLIT = flags.DEFINE_string("split", "train", "train | eval rows.")
OUT = flags.DEFINE_string("out", None, "JSON output path.", required=True)


def main(_):
  from agentfly_jax.rl.checkpoints import open_for_evaluation
  from agentfly_jax.rl.config import migrate
  from agentfly_jax.rl.run import rows_at
  from agentfly_jax.rl import stages
  from agentfly_jax.agents.display import mask_segments
  from agentfly_jax.tasks import webshop_brief as wb

  config = migrate(json.load(open(os.path.join(W.value, "config.json"))))
  config.log.progress = False
  config.rollout.branch_temperature = BT.value
  tr = open_for_evaluation(W.value, STEP.value, config=config)
  state = tr.state
  rows = rows_at(tr.run, 0, N.value) if SPLIT.value == "train" else tr.run.parts.eval_rows[: N.value]
  spec = tr.run.spec.rollout
  trajs = stages.rollout(
    tr.run.parts.agent,
    rows,
    sampler=tr.run.parts.sampler,
    rollout_spec=spec,
    end_of_turn_id=tr.run.parts.end_of_turn_id,
    env_provider=tr.run.parts.env_provider,
    num_chains=CH.value,
    seed=123,
  )
  model = nnx.merge(tr.run.parts.policy.graphdef, state.params, tr.run.parts.policy.rest)
  tok = tr.run.parts.tokenizer
  eot = tok.encode("<|im_end|>")
  back = tok.encode(wb._act("click[< prev]")) + eot
  fwd = nnx.jit(lambda m, ids: m(ids))
  groups = collections.defaultdict(list)
  for t in trajs:
    segs = mask_segments(t.action_mask)
    segs = [s for s in segs if s[2]]
    groups[t.group_id].append((t, segs))
  out = []
  for g, chains in sorted(groups.items()):
    acts = []
    for t, segs in chains:
      if len(segs) < 3:
        acts.append(("<3 turns", None, None))
        continue
      s0, s1 = segs[2][0], segs[2][1]
      prompt = list(t.token_ids[:s0])
      text = tok.decode(prompt)
      page = text.split("<tool_response>")[-1]
      goal = wb.parse_instruction(wb._INSTRUCTION.search(text).group(0))
      lacking = wb.lacks_asked_value(page, goal)
      ids = np.array([prompt + back], np.int32)
      L = ids.shape[1]
      Lp = ((L + 63) // 64) * 64
      pad = np.zeros((1, Lp), np.int32)
      pad[0, :L] = ids[0]
      logits = np.asarray(fwd(model, jnp.asarray(pad)))[0, :L].astype(np.float64)
      lp = (
        logits
        - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - logits.max(-1, keepdims=True)
      )
      pb = float(np.exp(sum(lp[len(prompt) - 1 + i, back[i]] for i in range(len(back)))))
      act = tok.decode(list(t.token_ids[s0:s1]))
      act = act.split('"action": ')[-1][:40] if '"action"' in act else act[:40]
      acts.append((act, lacking, pb))
    rew = [round(float(t.reward), 2) for t, _ in chains]
    print(f"group {g}: rewards {rew}")
    for a in acts:
      print(f"   lacking={a[1]} p_back={a[2] if a[2] is None else round(a[2], 3)} act={a[0]!r}")
    out.append(dict(group=g, rewards=rew, acts=acts))
  with open(OUT.value, "w") as f:
    json.dump(out, f, indent=1)


if __name__ == "__main__":
  app.run(main)
