"""Sequence packing: several right-padded trajectories per row of the same length T.

    packed, layout = pack_batch(batch, row_len=T)      # dict of [N, T] -> dict of [R, T], R <= N
    per_traj = unpack(packed_values, layout, T)        # [R, T] -> [N, T]

Multi-turn trajectories vary a lot in length; padding each to the longest wastes most of a step.
Packing puts them end to end (first-fit decreasing) and adds two fields the train step reads:
`segment_ids` int32 (1, 2, ... per trajectory in a row, 0 = padding; attention never crosses a
segment) and `positions` int32 (restart at 0 per segment). Every other [N, T] field is moved
token by token, so per-token losses, advantages and masks are unchanged, and the seq-mean
aggregations count segments (`losses.aggregate(segment_ids=...)`). A trajectory's first token
is never an action token (it is the prompt), so the one-token shift of the loss never scores a
token from the previous segment's context.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class PackLayout:
  """Where each source row went: row[i], offset[i] (start column) and length[i] of source row i."""

  row: np.ndarray
  offset: np.ndarray
  length: np.ndarray
  num_rows: int


def row_lengths(attention_mask: np.ndarray) -> np.ndarray:
  """int[N] real tokens per right-padded row of bool[N, T]; ValueError naming the row if a row
  is not a prefix of real tokens followed by padding."""
  am = np.asarray(attention_mask, bool)
  lengths = am.sum(axis=1)
  prefix = np.arange(am.shape[1])[None, :] < lengths[:, None]
  bad = np.nonzero((am != prefix).any(axis=1))[0]
  if len(bad):
    raise ValueError(f"pack_batch: attention_mask row {int(bad[0])} is not right-padded (real tokens, then padding)")
  return lengths


def first_fit_decreasing(lengths: np.ndarray, row_len: int) -> PackLayout:
  """Bins of capacity `row_len`: longest sequence first, each into the first row with room."""
  lengths = np.asarray(lengths, np.int64)
  if (lengths > row_len).any():
    i = int(np.argmax(lengths > row_len))
    raise ValueError(f"pack_batch: row {i} has {int(lengths[i])} tokens, more than row_len={row_len}")
  row = np.zeros(len(lengths), np.int64)
  offset = np.zeros(len(lengths), np.int64)
  used: list[int] = []
  for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
    for r, u in enumerate(used):
      if u + lengths[i] <= row_len:
        break
    else:
      r = len(used)
      used.append(0)
    row[i], offset[i] = r, used[r]
    used[r] += int(lengths[i])
  return PackLayout(row=row, offset=offset, length=lengths, num_rows=max(1, len(used)))


def pack_index(
  attention_mask: np.ndarray, rows: np.ndarray | None = None, *, row_len: int | None = None
) -> tuple[dict, PackLayout]:
  """Where each packed slot reads from: for the right-padded rows `rows` (default all) of
  attention_mask bool[N, T], packed into [R, row_len] (default T), returns ({"src_row",
  "src_col" int32[R, row_len] (indices into the [N, T] arrays), "valid" bool, "segment_ids",
  "positions" int32[R, row_len]}, layout over the selected rows)."""
  am = np.asarray(attention_mask, bool)
  rows = np.arange(am.shape[0]) if rows is None else np.asarray(rows)
  row_len = am.shape[1] if row_len is None else int(row_len)
  layout = first_fit_decreasing(row_lengths(am[rows]), row_len)
  src_row, src_col, dst_row, dst_col = _token_moves(layout)
  shape = (layout.num_rows, row_len)
  index = {
    "src_row": np.zeros(shape, np.int32),
    "src_col": np.zeros(shape, np.int32),
    "valid": np.zeros(shape, bool),
    "segment_ids": np.zeros(shape, np.int32),
    "positions": np.zeros(shape, np.int32),
  }
  rank = np.zeros(len(rows), np.int32)  # segment number within its packed row, in column order
  for r in range(layout.num_rows):
    members = np.nonzero(layout.row == r)[0]
    rank[members[np.argsort(layout.offset[members])]] = np.arange(1, len(members) + 1)
  index["src_row"][dst_row, dst_col] = rows[src_row]
  index["src_col"][dst_row, dst_col] = src_col
  index["valid"][dst_row, dst_col] = True
  index["segment_ids"][dst_row, dst_col] = rank[src_row]
  index["positions"][dst_row, dst_col] = src_col
  return index, layout


def take_packed(batch: dict, index: dict) -> dict:
  """Every [N, T, ...] array of `batch` gathered into packed [R, row_len, ...] rows (0 / False on padding),
  plus `segment_ids` and `positions`. Works on numpy arrays and, inside jit, on jnp arrays."""
  out = {}
  for k, v in batch.items():
    sel = v[index["src_row"], index["src_col"]]
    valid = index["valid"].reshape(index["valid"].shape + (1,) * (sel.ndim - 2))
    out[k] = sel * valid.astype(sel.dtype) if sel.dtype != bool else sel & valid
  out["segment_ids"], out["positions"] = index["segment_ids"], index["positions"]
  return out


def pack_batch(batch: dict, *, row_len: int | None = None) -> tuple[dict, PackLayout]:
  """Packs every [N, T] array of `batch` (must hold a right-padded `attention_mask`) into
  [R, row_len] rows (default row_len = T), adding `segment_ids` and `positions` (int32).
  Padding is 0 / False in every field. Returns (packed, layout)."""
  if "attention_mask" not in batch:
    raise ValueError("pack_batch: the batch needs an 'attention_mask' [N, T]")
  n = batch["attention_mask"].shape[0]
  for k, v in batch.items():
    if np.ndim(v) != 2 or v.shape[0] != n:
      raise ValueError(f"pack_batch: field {k!r} has shape {np.shape(v)}, expected [{n}, T]")
  index, layout = pack_index(batch["attention_mask"], row_len=row_len)
  return take_packed({k: np.asarray(v) for k, v in batch.items()}, index), layout


def _token_moves(layout: PackLayout):
  """(src_row, src_col, dst_row, dst_col) int arrays, one entry per real token."""
  src_row = np.repeat(np.arange(len(layout.length)), layout.length)
  starts = np.cumsum(layout.length) - layout.length
  src_col = np.arange(int(layout.length.sum())) - np.repeat(starts, layout.length)
  return src_row, src_col, layout.row[src_row], layout.offset[src_row] + src_col


def unpack(packed: np.ndarray, layout: PackLayout, seq_len: int) -> np.ndarray:
  """[R, row_len, ...] per-token values of packed rows -> [N, seq_len, ...] (padding 0)."""
  packed = np.asarray(packed)
  src_row, src_col, dst_row, dst_col = _token_moves(layout)
  out = np.zeros((len(layout.length), seq_len, *packed.shape[2:]), packed.dtype)
  out[src_row, src_col] = packed[dst_row, dst_col]
  return out


def padding_fraction(attention_mask: np.ndarray) -> float:
  """Share of the [R, T] slots that are padding."""
  am = np.asarray(attention_mask, bool)
  return float(1.0 - am.sum() / max(1, am.size))
