"""Built-in env types; importing this package registers them (the simulators they drive, e.g.
ScienceWorld's JVM or TextWorld, are imported only when an instance starts)."""

from envservers.envs import (
  alfworld_env,
  gym_env,
  image_probe,
  miniwob_env,
  openenv_env,
  python_sandbox,
  retrieval,
  scienceworld_env,  # noqa: F401
  swe,
  testing,
  textworld_env,
  visual_qa,
  webshop,
)  # (registration side effects)
