"""Built-in env types; importing this package registers them (the simulators they drive, e.g.
ScienceWorld's JVM or TextWorld, are imported only when an instance starts)."""
from envservers.envs import (python_sandbox, scienceworld_env, testing,  # noqa: F401 (registers)
                             textworld_env, webshop)
