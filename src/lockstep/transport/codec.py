"""Arrays to and from ``Tensor`` messages: raw little-endian bytes, dtype and shape.

Decoding is zero-copy (``np.frombuffer`` over the message bytes, read-only) and
validates everything a peer could get wrong, raising ``CodecError`` with a message
that names the field, what arrived and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lockstep.transport import lockstep_pb2 as pb

# Only plain numeric dtypes cross the wire; object or structured dtypes never do.
ALLOWED_DTYPES = frozenset(
    ["bool", "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
     "float16", "float32", "float64"]
)
MAX_DIMS = 8


class CodecError(ValueError):
    """A tensor message that cannot be decoded or does not match what is expected."""


def encode(array: np.ndarray) -> pb.Tensor:
    """Encode an array as a Tensor message (little-endian, C order)."""
    array = np.asarray(array)
    if array.dtype.name not in ALLOWED_DTYPES:
        raise CodecError(f"cannot encode dtype {array.dtype.name}; allowed: {sorted(ALLOWED_DTYPES)}")
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return pb.Tensor(dtype=array.dtype.name, shape=array.shape, data=np.ascontiguousarray(little).tobytes())


def decode(
    tensor: pb.Tensor,
    name: str,
    dtype: np.dtype | str | None = None,
    shape: Sequence[int | None] | None = None,
) -> np.ndarray:
    """Decode a Tensor message into a read-only array that shares the message's bytes.

    ``dtype`` and ``shape`` are what the receiver expects; ``None`` in ``shape``
    accepts any size in that dimension.
    """
    if tensor.dtype not in ALLOWED_DTYPES:
        raise CodecError(f"{name}: unknown dtype {tensor.dtype!r}; allowed: {sorted(ALLOWED_DTYPES)}")
    got_dtype = np.dtype(tensor.dtype)
    if dtype is not None and got_dtype != np.dtype(dtype):
        raise CodecError(f"{name}: dtype {got_dtype.name} does not match the expected {np.dtype(dtype).name}")
    got_shape = tuple(int(d) for d in tensor.shape)
    if len(got_shape) > MAX_DIMS or any(d < 0 for d in got_shape):
        raise CodecError(f"{name}: invalid shape {got_shape}")
    if shape is not None:
        expected = tuple(shape)
        if len(expected) != len(got_shape) or any(
                e is not None and e != g for e, g in zip(expected, got_shape, strict=True)):
            shown = tuple("*" if e is None else e for e in expected)
            raise CodecError(f"{name}: shape {got_shape} does not match the expected {shown}")
    count = math.prod(got_shape)  # exact: a huge shape must not wrap around to a small count
    if len(tensor.data) != count * got_dtype.itemsize:
        raise CodecError(
            f"{name}: {len(tensor.data)} bytes of data for shape {got_shape} and dtype {got_dtype.name} "
            f"(expected {count * got_dtype.itemsize})"
        )
    array = np.frombuffer(tensor.data, dtype=got_dtype.newbyteorder("<"), count=count).reshape(got_shape)
    return array.astype(got_dtype, copy=False)
