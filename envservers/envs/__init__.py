"""Built-in env types; importing this package registers them (the simulators they drive, e.g.
ScienceWorld's JVM or TextWorld, are imported only when an instance starts)."""
from envservers.envs import python_sandbox, testing, webshop  # noqa: F401  (registration side effects)
