"""The files of a Hugging Face checkpoint folder and the error every bad one raises.

:func:`safetensors_header` reads a shard's header (never its tensors) and the byte length the
file must have. Standard library only: the folder checks and the writers above both use it.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
BIN_INDEX_FILE = "pytorch_model.bin.index.json"  # a folder of PyTorch .bin weights, which the conversions do not read
BIN_SINGLE_FILE = "pytorch_model.bin"


class HfCheckpointError(Exception):
    """Bad input to a conversion: the message names the field or file and the fix."""


class AdapterExportError(Exception):
    """The adapter-only folder of a LoRA export failed after its merged folder was written."""


# The exit status of an export that failed after its input was read whole: the adapter-only folder
# of convert_checkpoint.py export, any export at the end of a training run.
EXPORT_FAILED = 3


# The safetensors format caps its JSON header at 100 MB; a larger declared length is damage.
MAX_HEADER_BYTES = 100 * 2**20


def safetensors_header(file: Path) -> tuple[dict, int]:
    """(header, expected file size in bytes) of a safetensors file; the size from the header's offsets.
    A header length beyond the file or the format's cap, or a header that is not a mapping of
    tensors with two integer offsets each, a dtype and a shape whose bytes fill those offsets, is an
    HfCheckpointError (never read into memory whole)."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise HfCheckpointError(f"shard {file.name} is truncated ({size} bytes, no header)")
        (n,) = struct.unpack("<Q", raw)
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise HfCheckpointError(
                f"shard {file.name} is truncated or damaged: its header claims {n:,} bytes of a {size:,}-byte file; "
                "download it again"
            )
        body = f.read(n)
    try:
        header = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        raise HfCheckpointError(f"shard {file.name} has an unreadable header (not a safetensors file?)") from None
    if not isinstance(header, dict):
        raise HfCheckpointError(f"shard {file.name} has a damaged header (not a JSON object); download it again")
    ends = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        ):
            raise HfCheckpointError(
                f"shard {file.name} has a damaged header: tensor {name!r} has no valid data_offsets; download it again"
            )
        if problem := _entry_problem(entry, offsets):
            raise HfCheckpointError(
                f"shard {file.name} has a damaged header: tensor {name!r} {problem}; download it again"
            )
        ends.append(offsets[1])
    return header, 8 + n + max(ends, default=0)


# Bytes per element of the safetensors dtypes (the sub-byte ones are left out: their bytes are not checked).
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


def _entry_problem(entry: dict, offsets: list[int]) -> str | None:
    """Why a header entry's shape, dtype and data offsets disagree, or None: the bytes between its two
    offsets are the elements of its shape times the size of its dtype."""
    shape, dtype = entry.get("shape"), entry.get("dtype")
    if not isinstance(dtype, str):
        return f"has no dtype ({dtype!r})"
    if type(shape) is not list or not all(type(d) is int and d >= 0 for d in shape):  # bool is not int here
        return f"has no valid shape ({shape!r})"
    if offsets[0] > offsets[1]:
        return f"ends before it starts (data_offsets {offsets})"
    size = DTYPE_BYTES.get(dtype)
    held, needs = offsets[1] - offsets[0], math.prod(shape) * (size or 0)
    if size is not None and needs != held:
        return f"is {dtype} of shape {shape} ({needs:,} bytes) over {held:,} bytes of data"
    return None
