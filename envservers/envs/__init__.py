"""Built-in env types; importing this package registers them."""
from envservers.envs import python_sandbox, retrieval, testing  # noqa: F401  (registration side effects)
