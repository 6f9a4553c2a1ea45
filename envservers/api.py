"""The public surface of `envservers` for the trainer side (agentfly_jax.tasks): the shared data and
scripted policies of the built-in worlds, which a task and its server must agree on. A task imports
them from here, never from `envservers.envs.*` (tests/house/test_import_graph.py), so a server's
modules can move without reaching into tasks.

  from envservers.api import generate_catalog, make_goals         # webshop: catalog + goals
  from envservers.api import swe_tasks, swe_rows, swe_policies    # swe: shipped tasks, row checks, expert
  from envservers.api import TEXTWORLD_DIFFICULTIES               # textworld: generated game kinds
  from envservers.api import harbor_tasks                          # Harbor task dirs: loader, shipped examples
  from envservers.api import visual_qa_rows                        # visual_qa: rows from a seed, splits
"""

from envservers.envs import harbor_tasks, swe_policies, swe_rows, swe_tasks, visual_qa_rows
from envservers.envs.textworld_games import DIFFICULTIES as TEXTWORLD_DIFFICULTIES
from envservers.envs.webshop_catalog import DEFAULT_CATALOG_SEED, DEFAULT_NUM_PRODUCTS, generate_catalog, make_goals
from envservers.envs.webshop_policies import expert_actions, random_action

__all__ = [
  "DEFAULT_CATALOG_SEED",
  "DEFAULT_NUM_PRODUCTS",
  "TEXTWORLD_DIFFICULTIES",
  "expert_actions",
  "generate_catalog",
  "harbor_tasks",
  "make_goals",
  "random_action",
  "swe_policies",
  "swe_rows",
  "swe_tasks",
  "visual_qa_rows",
]
