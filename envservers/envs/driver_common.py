"""What the sandbox drivers (sandbox_driver.py, swe_driver.py) share: the frames they read and
write on their private descriptors (4-byte big-endian length + JSON) and the rlimits they set at
start. Stdlib only: a driver runs as `python -c <source>` inside the sandbox, where there is no
envservers package, so the host inlines this file in place of the driver's one
`from envservers.envs.driver_common import ...` line (bwrap.driver_source).
"""

import json
import os
import resource
import signal
import struct

_HEADER = struct.Struct(">I")


def read_exact(fd, n):
  """`n` bytes from `fd`, or None where the input ends first."""
  chunks, got = [], 0
  while got < n:
    chunk = os.read(fd, min(n - got, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def send(fd, message):
  """Writes `message` to `fd` as one frame."""
  body = json.dumps(message).encode("utf-8")
  data = _HEADER.pack(len(body)) + body
  while data:
    data = data[os.write(fd, data) :]


def receive(fd):
  """The next request read from `fd`, or None at the end of the input (the host closed it)."""
  header = read_exact(fd, _HEADER.size)
  if header is None:
    return None
  body = read_exact(fd, _HEADER.unpack(header)[0])
  return None if body is None else json.loads(body)


def set_rlimits(config):
  """The sandbox's limits, inherited by everything it starts: address space (`memory_mb`),
  processes (`max_procs`), file size (`file_size_mb`; a too-large write fails with EFBIG instead
  of a signal), open files (`max_open_files`), no core files."""
  mb = 1024 * 1024
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_AS, (config["memory_mb"] * mb,) * 2)
  resource.setrlimit(resource.RLIMIT_NPROC, (config["max_procs"],) * 2)
  resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_size_mb"] * mb,) * 2)
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  resource.setrlimit(resource.RLIMIT_NOFILE, (config["max_open_files"],) * 2)
