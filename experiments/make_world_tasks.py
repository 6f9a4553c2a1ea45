"""Task sets of the interactive worlds as AgentFly JSON rows (a JSON list of row dicts).

  .venv/bin/python experiments/make_world_tasks.py --world=webshop --out=data/webshop
  .venv/bin/python experiments/make_world_tasks.py --world=textworld --out=data/textworld \
      --num_train=200 --num_test=50 --generate      # also compile the games into the cache
  .venv/bin/python experiments/make_world_tasks.py --world=scienceworld --out=data/scienceworld

Writes OUT/train.json and OUT/test.json (scienceworld also OUT/dev.json and the variation split
of every task, OUT/splits.json, read from the simulator: ScienceWorld's own train/dev/test).
"""

import json
import os
import sys


from absl import app, flags  # noqa: E402

_WORLD = flags.DEFINE_enum("world", None, ["webshop", "textworld", "scienceworld"], "Which world.")
_OUT = flags.DEFINE_string("out", None, "Output folder.")
_NUM_TRAIN = flags.DEFINE_integer("num_train", 1000, "Training rows (webshop / textworld).")
_NUM_TEST = flags.DEFINE_integer("num_test", 100, "Test rows (webshop / textworld).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed.")
_GENERATE = flags.DEFINE_bool("generate", False, "textworld: compile every game now.")
_SIMPLIFICATION = flags.DEFINE_string("simplification", "easy", "scienceworld simplification.")


def scienceworld_splits() -> dict:
  """{task: {"train": [...], "dev": [...], "test": [...]}} from ScienceWorld itself."""
  from scienceworld import ScienceWorldEnv

  env = ScienceWorldEnv("", envStepLimit=100)
  try:
    splits = {}
    for task in env.get_task_names():
      env.load(task, 0, "", generateGoldPath=False)
      splits[task] = {
        "train": list(env.get_variations_train()),
        "dev": list(env.get_variations_dev()),
        "test": list(env.get_variations_test()),
      }
      print(task, {k: len(v) for k, v in splits[task].items()}, flush=True)
    return splits
  finally:
    env.close()


def main(argv):
  del argv
  from agentfly_jax.tasks.worlds import write_rows

  out = _OUT.value or os.path.join("data", _WORLD.value)
  if _WORLD.value == "webshop":
    from agentfly_jax.tasks import webshop

    sets = {
      "train": webshop.make_rows(_NUM_TRAIN.value, _SEED.value),
      "dev": webshop.make_eval_rows(_NUM_TEST.value, _SEED.value),
      "test": webshop.make_test_rows(_NUM_TEST.value, _SEED.value),  # goal products in neither train nor dev
    }
  elif _WORLD.value == "textworld":
    from agentfly_jax.tasks import textworld

    sets = {
      "train": textworld.make_rows_split(_NUM_TRAIN.value, _SEED.value, "train"),
      "test": textworld.make_rows_split(_NUM_TEST.value, _SEED.value, "test"),
    }
    if _GENERATE.value:
      from envservers.envs.textworld_games import game_file

      for row in sets["train"] + sets["test"]:
        row["game_file"] = game_file(row["game_kind"], row["difficulty"], row["game_seed"])
  else:
    from agentfly_jax.tasks import scienceworld

    splits = scienceworld_splits()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "splits.json"), "w") as f:
      json.dump(splits, f)
    sets = {s: scienceworld.rows_from_splits(splits, s, _SIMPLIFICATION.value) for s in ("train", "dev", "test")}
  for name, rows in sets.items():
    print(f"{name}: {len(rows)} rows -> {write_rows(rows, os.path.join(out, name + '.json'))}")


if __name__ == "__main__":
  flags.mark_flag_as_required("world")
  app.run(main)
