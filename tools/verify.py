"""Comparing a candidate's outputs with the reference's, in the trusted process.

Tolerances per dtype (an element passes when |out - ref| <= atol + rtol * |ref|):

| dtype | atol | rtol |
|---|---|---|
| float64 | 1e-7 | 1e-7 |
| float32 | 1e-4 | 1e-4 |
| float16 | 1e-2 | 1e-2 |
| bfloat16 | 2e-2 | 2e-2 |
| integers, bool | exact | exact |

NaN and infinity must sit at the same positions (infinities with the same sign); they are left out of the numeric
comparison. TF32 is off for reference and candidate alike (tools/numerics.py), so float32 means float32.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (2e-2, 2e-2),
}
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool)}


def read_output(meta: dict, workdir: Path, device: torch.device) -> torch.Tensor:
    """Rebuild an output tensor from the raw bytes a worker wrote; nothing in the file is executed or unpickled."""
    dtype = DTYPES.get(meta.get("dtype"))
    if dtype is None:
        raise ValueError(f"output dtype {meta.get('dtype')!r} is not one kloop compares")
    shape = [int(s) for s in meta.get("shape", [])]
    path = Path(meta.get("file", "")).resolve()
    if path.parent != workdir.resolve():
        raise ValueError("output file outside the worker's directory")
    raw = np.fromfile(path, dtype=np.uint8)
    count = int(np.prod(shape)) if shape else 1
    itemsize = torch.empty(0, dtype=dtype).element_size()
    if raw.size != count * itemsize:
        raise ValueError(f"output holds {raw.size} bytes, shape {shape} of {dtype} needs {count * itemsize}")
    t = torch.from_numpy(raw)
    t = t.to(torch.bool) if dtype == torch.bool else t.view(dtype)
    return t.reshape(shape).to(device)


def view_buffer(meta: dict, buffer: torch.Tensor) -> torch.Tensor:
    """An output the worker copied into a buffer we lent it: our bytes, read as the dtype and shape it claims."""
    dtype = DTYPES.get(meta.get("dtype"))
    if dtype is None or dtype == torch.bool:
        raise ValueError(f"output dtype {meta.get('dtype')!r} cannot come back through a buffer")
    shape = [int(s) for s in meta.get("shape", [])]
    if int(np.prod(shape)) * buffer.new_empty(0, dtype=dtype).element_size() != buffer.numel():
        raise ValueError(f"output shape {shape} of {dtype} does not fill the {buffer.numel()} bytes it was given")
    return buffer.view(dtype).reshape(shape)


def compare(out: torch.Tensor, ref: torch.Tensor, index: int = 0) -> tuple[list[str], dict]:
    """Reasons the output is wrong (empty if right) and the error statistics."""
    if out.dtype != ref.dtype:
        return [f"output {index} has dtype {out.dtype}, expected {ref.dtype}"], {}
    if tuple(out.shape) != tuple(ref.shape):
        return [f"output {index} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}"], {}
    if not ref.is_floating_point():
        wrong = out != ref
        n = int(wrong.sum())
        stats = {"mismatches": n, "max_abs_err": 0.0 if n == 0 else None}
        return ([f"output {index}: {n} of {ref.numel()} elements differ (exact match required)"] if n else []), stats
    o, r = out.double(), ref.double()
    reasons = []
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    if not torch.equal(nan_o, nan_r):
        where = _first(nan_o != nan_r, ref.shape)
        reasons.append(f"output {index}: NaN positions differ from the reference (first at {where})")
    inf_o, inf_r = torch.isinf(o), torch.isinf(r)
    if not torch.equal(inf_o, inf_r) or not torch.equal(o[inf_r], r[inf_r]):
        where = _first((inf_o != inf_r) | (inf_r & (o != r)), ref.shape)
        reasons.append(f"output {index}: infinities differ from the reference (first at {where})")
    finite = ~(nan_r | inf_r | nan_o | inf_o)
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    diff = torch.where(finite, (o - r).abs(), torch.zeros_like(o))
    allowed = atol + rtol * r.abs()
    bad = finite & (diff > allowed)
    max_abs = float(diff.max()) if diff.numel() else 0.0
    rel = torch.where(finite, diff / r.abs().clamp_min(atol), torch.zeros_like(o))
    stats = {"max_abs_err": max_abs, "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
             "mismatches": int(bad.sum()), "atol": atol, "rtol": rtol}
    if stats["mismatches"]:
        flat = int(torch.argmax(torch.where(bad, diff - allowed, torch.full_like(diff, -1.0))))
        where = _unravel(flat, ref.shape)
        stats["worst"] = {"index": where, "got": float(o.reshape(-1)[flat]), "expected": float(r.reshape(-1)[flat])}
        reasons.append(
            f"output {index}: {stats['mismatches']} of {ref.numel()} elements outside atol={atol} rtol={rtol}; "
            f"max abs error {max_abs:.3g}, worst at {where}: got {stats['worst']['got']:.6g}, "
            f"expected {stats['worst']['expected']:.6g}")
    return reasons, stats


def _first(mask: torch.Tensor, shape) -> list[int]:
    return _unravel(int(torch.argmax(mask.reshape(-1).to(torch.uint8))), shape)


def _unravel(flat: int, shape) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, tuple(shape))] if len(shape) else []
