"""Arrow <-> numpy without per-element Python and without pandas: the column helpers every pass uses.

`pa.array` and `to_numpy` ask pandas whether their input is a pandas object, which imports pandas (0.2 s) into
every worker; these build arrays from numpy buffers directly.

    >>> list_rows(list_array([np.array([1, 2]), np.array([], np.int32), np.array([3])], pa.int32()))[0].tolist()
    [1, 2]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

_NP_DTYPES = {
    pa.int8(): np.int8,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint64(): np.uint64,
    pa.float32(): np.float32,
}


def arrow(values: Any, dtype: pa.DataType) -> pa.Array:
    """A numpy array (or list) as an Arrow array of `dtype`, zero-copy from one buffer. Not `pa.array`: that asks
    pandas whether the input is a pandas object, which imports pandas (0.2 s) into every worker.

    >>> arrow([1, 2, 3], pa.int8()).to_pylist()
    [1, 2, 3]
    """
    a = np.ascontiguousarray(values, dtype=_NP_DTYPES[dtype])
    return pa.Array.from_buffers(dtype, len(a), [None, pa.py_buffer(a)])


def numpy_of(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A null-free primitive Arrow array as a read-only numpy view (`to_numpy` would import pandas).

    >>> numpy_of(arrow([1, 2, 3, 4], pa.int32()).slice(1, 2)).tolist()
    [2, 3]
    """
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if a.null_count:
        raise ValueError("numpy_of: the array has nulls")
    return np.frombuffer(a.buffers()[1], dtype=_NP_DTYPES[a.type])[a.offset : a.offset + len(a)]


def list_array(rows: list[np.ndarray], dtype: pa.DataType) -> pa.ListArray:
    """Variable-length rows -> Arrow list array, built from one flat buffer (no per-element Python)."""
    np_dtype = _NP_DTYPES[dtype]  # not dtype.to_pandas_dtype(): that imports pandas (0.2 s)
    lens = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    values = np.concatenate(rows).astype(np_dtype, copy=False) if len(rows) and lens.sum() else np.zeros(0, np_dtype)
    return flat_list_array(values, lens, dtype)


def flat_list_array(values: np.ndarray, lens: np.ndarray, dtype: pa.DataType) -> pa.ListArray:
    """Rows given as their values back to back and each row's length -> Arrow list array.

    >>> flat_list_array(np.arange(5), np.array([2, 0, 3]), pa.int32()).to_pylist()
    [[0, 1], [], [2, 3, 4]]
    """
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    return pa.ListArray.from_arrays(arrow(offsets, pa.int32()), arrow(values, dtype))


def list_rows(col: pa.ChunkedArray | pa.ListArray) -> list[np.ndarray]:
    """Arrow list column -> list of numpy views (the inverse of `list_array`)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    offsets = numpy_of(col.offsets)
    values = numpy_of(col.values)
    base = offsets[0]
    return [values[offsets[i] - base : offsets[i + 1] - base] for i in range(len(col))] if len(col) else []


def string_array(values: list[str]) -> pa.StringArray:
    """Python strings -> Arrow string array, from one buffer (not `pa.array`, which imports pandas).

    >>> string_array(["a", "", "ßx"]).to_pylist()
    ['a', '', 'ßx']
    """
    data = [v.encode() for v in values]
    offsets = np.zeros(len(data) + 1, dtype=np.int32)
    np.cumsum(np.fromiter(map(len, data), np.int64, len(data)), out=offsets[1:])
    return pa.StringArray.from_buffers(len(data), pa.py_buffer(offsets), pa.py_buffer(b"".join(data)))


def fixed_rows_array(rows: np.ndarray) -> pa.FixedSizeBinaryArray:
    """A 2-D numpy array -> Arrow fixed-size binary array, one row per value (signatures, keys).

    >>> fixed_rows(fixed_rows_array(np.arange(6, dtype=np.uint32).reshape(3, 2)), np.uint32).tolist()
    [[0, 1], [2, 3], [4, 5]]
    """
    rows = np.ascontiguousarray(rows)
    width = rows.dtype.itemsize * rows.shape[1]
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(rows), [None, pa.py_buffer(rows)])


def fixed_rows(col: pa.Array | pa.ChunkedArray, dtype: Any) -> np.ndarray:
    """The inverse of `fixed_rows_array`: (rows, width / itemsize) numpy view of a fixed-size binary column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    dtype = np.dtype(dtype)
    per_row = col.type.byte_width // dtype.itemsize
    flat = np.frombuffer(col.buffers()[1], dtype=dtype)
    return flat[col.offset * per_row : (col.offset + len(col)) * per_row].reshape(len(col), per_row)
