"""bench_train_step's PyTorch reference step, and the worker process each framework is timed in.

    step = TorchStep(folder, b, t, make_batch=make_batch, critic=True)   # transformers, eager, float32
    step.run("ppo")                       # {"loss": ..., "vf_loss": ...}: one policy + critic step
    serve_steps(step, ["policy", "ppo"])  # the worker's loop: first steps (compile), READY, then commands
    worker = Worker(script, "tiny:8x256:torch", ["ppo"], extra_flags)   # parent side; worker.ask("run ppo")

The step's hyperparameters (`LR` ... `VALUE_CLIP`) and the critic's value head (`value_head`) are
the ones the JAX step of bench_train_step.py runs with: both frameworks start from the same
weights and batch. Runs from lab/bench/ (this folder is on sys.path: `bench_common`).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

from bench_common import WorkerProcess

LR, WEIGHT_DECAY, CLIP, DUAL_CLIP, MAX_GRAD_NORM, VALUE_CLIP = 1e-6, 0.01, 0.2, 3.0, 1.0, 0.5


def value_head(d: int):
  """float32[d] the critic's value-head weights both frameworks start from (seeded)."""
  import numpy as np

  return (np.random.default_rng(7).normal(size=(d,)) * 0.02).astype(np.float32)


class TorchStep:
  """The step in PyTorch + transformers on the HF folder `folder`: the policy
  (AutoModelForCausalLM) and, with `critic`, a value-head model with the same trunk
  (AutoModelForTokenClassification, 1 label). `make_batch(vocab, b, t, layout=layout)` gives the
  numpy [B, T] token-aligned batch (bench_train_step.make_batch)."""

  def __init__(self, folder: str, b: int, t: int, *, make_batch, critic: bool, layout: str = "prompt"):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    torch.manual_seed(0)
    self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=1e-8)
    if critic:
      self.critic = AutoModelForTokenClassification.from_pretrained(folder, num_labels=1, dtype=torch.float32).eval()
      with torch.no_grad():
        self.critic.score.weight.copy_(torch.from_numpy(value_head(self.model.config.hidden_size))[None])
        if self.critic.score.bias is not None:
          self.critic.score.bias.zero_()
      self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=LR, weight_decay=WEIGHT_DECAY, eps=1e-8)
    batch = make_batch(self.model.config.vocab_size, b, t, layout=layout)
    self.batch = {k: torch.from_numpy(v) for k, v in batch.items()}
    # TRL's logits_to_keep: logits only from the first position that predicts a completion
    # token on (the prompt's own next-token predictions are never trained on).
    self.keep = t - t // 4

  def _policy(self) -> float:
    import torch

    bt = self.batch
    ids, am = bt["token_ids"].long(), bt["attention_mask"].long()
    k = self.keep
    logits = self.model(input_ids=ids[:, :-1], attention_mask=am[:, :-1], logits_to_keep=k).logits.float()
    target = ids[:, 1:][:, -k:]
    # TRL's selective_log_softmax for float32: gather minus a per-row logsumexp (loop saves memory)
    picked = torch.gather(logits, -1, target[..., None])[..., 0]
    lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    lp = picked - lse
    with torch.no_grad():  # entropy as a metric, as the JAX step reports it
      p = torch.softmax(logits, -1)
      _ = lse - (p * logits).sum(-1)
    mask = bt["action_mask"][:, 1:][:, -k:].float()
    old, adv = bt["old_logprobs"][:, 1:][:, -k:], bt["advantages"][:, 1:][:, -k:]
    ratio = torch.exp(torch.clamp(lp - old, -20.0, 20.0))
    loss = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - CLIP, 1 + CLIP))
    loss = torch.where(adv < 0, torch.minimum(loss, -adv * DUAL_CLIP), loss)
    loss = (loss * mask).sum() / mask.sum().clamp(min=1e-8)
    self.opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
    self.opt.step()
    return float(loss)

  def _critic(self) -> float:
    import torch

    bt = self.batch
    ids, am = bt["token_ids"].long(), bt["attention_mask"].long()
    values = self.critic(input_ids=ids[:, :-1], attention_mask=am[:, :-1]).logits[..., 0].float()
    mask = bt["action_mask"][:, 1:].float()
    old, ret = bt["old_values"][:, 1:], bt["returns"][:, 1:]
    clipped = old + torch.clamp(values - old, -VALUE_CLIP, VALUE_CLIP)
    loss = 0.5 * torch.maximum((values - ret) ** 2, (clipped - ret) ** 2)
    loss = (loss * mask).sum() / mask.sum().clamp(min=1e-8)
    self.critic_opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.critic.parameters(), MAX_GRAD_NORM)
    self.critic_opt.step()
    return float(loss)

  def run(self, step: str) -> dict:
    out = {"loss": self._policy()}
    if step == "ppo":
      out["vf_loss"] = self._critic()
    return out


def serve_steps(runner, steps: list[str]) -> None:
  """Worker loop of a built `runner` (TorchStep, bench_train_step.JaxStep): runs each step once
  (compile), prints READY, then answers "run STEP" with {"wall", "cpu", ...} JSON lines; "mem" ->
  peak RSS; "quit" (or end of input) ends it."""
  out = sys.__stdout__
  rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  first = {}
  for step in steps:
    t0 = time.perf_counter()
    first[step] = {**runner.run(step), "compile_s": time.perf_counter() - t0}
  print(json.dumps({"ready": True, "first": first, "rss_loaded": rss_loaded}), file=out, flush=True)
  for line in sys.stdin:
    cmd = line.split()
    if not cmd or cmd[0] == "quit":
      break
    if cmd[0] == "mem":
      reply = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    else:
      c0, t0 = os.times(), time.perf_counter()
      reply = runner.run(cmd[1])
      c1 = os.times()
      reply.update(wall=time.perf_counter() - t0, cpu=(c1.user - c0.user) + (c1.system - c0.system))
    print(json.dumps(reply), file=out, flush=True)


class Worker(WorkerProcess):
  """Parent-side handle of `script --serve=MODEL:SHAPE:FRAMEWORK --steps=... *flags` (a worker
  process running `serve_steps`); `ready` = its READY reply."""

  def __init__(self, script: str, spec: str, steps: list[str], flags: list[str], env: dict | None = None):
    cmd = [sys.executable, script, f"--serve={spec}", f"--steps={','.join(steps)}", *flags]
    super().__init__(cmd, label=spec, env=env)
    self.ready = self.first
