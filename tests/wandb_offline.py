"""Reading back what an offline W&B run recorded (its run-<id>.wandb file), for tests.

The file is W&B's record log: a 7-byte header (":W&B", magic 0xBEE1, version) then LevelDB-log
framing (32 KiB blocks; each chunk = crc32 (4) + length (2, little-endian) + type (1: full,
2: first, 3: middle, 4: last)) around serialized `wandb_internal_pb2.Record` protobufs.
"""

from __future__ import annotations

import glob
import json
import os
import struct

_BLOCK = 32 * 1024
_HEADER = 7


def read_records(path: str) -> list[bytes]:
  """The serialized records of a .wandb file, in order."""
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", f"{path} is not a W&B record log"
  records, pending, pos = [], b"", _HEADER
  while pos + _HEADER <= len(data):
    left_in_block = _BLOCK - pos % _BLOCK
    if left_in_block < _HEADER:  # block trailer padding
      pos += left_in_block
      continue
    _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
    chunk = data[pos + _HEADER : pos + _HEADER + length]
    pos += _HEADER + length
    if kind == 0 and length == 0:  # zero padding at the end of a block
      pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0
      continue
    pending = chunk if kind in (1, 2) else pending + chunk
    if kind in (1, 4):
      records.append(pending)
      pending = b""
  return records


def offline_history(wandb_dir: str) -> list[dict]:
  """The logged history rows ({metric: value, "_step": step}) of the one offline run under
  `wandb_dir` (WANDB_DIR), in logging order."""
  from wandb.proto import wandb_internal_pb2 as pb

  runs = glob.glob(os.path.join(wandb_dir, "wandb", "offline-run-*", "run-*.wandb"))
  assert len(runs) == 1, f"expected one offline run under {wandb_dir}, found {runs}"
  rows = []
  for raw in read_records(runs[0]):
    record = pb.Record()
    record.ParseFromString(raw)
    if record.WhichOneof("record_type") == "history":
      rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
  return rows
