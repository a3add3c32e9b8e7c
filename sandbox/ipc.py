"""Handing GPU tensors from the executor to the referee (CUDA IPC), described in plain JSON.

Only ever in one direction: the referee opens the executor's memory, never the other way round, so no candidate
kernel (which runs in the executor's CUDA context) can reach a reference output. Nothing crosses the pipe but
integers, strings and base64 handles; the referee rebuilds each tensor with the dtype, shape and strides it asked for.
"""
from __future__ import annotations

import base64

import torch


def describe(t: torch.Tensor, stable: bool = False) -> dict:
    """What another process needs to view tensor `t` (its storage's IPC handle and the view's layout).
    stable: the buffer stays allocated, and is only written by the sharer, until the referee is told to `release`:
    the referee may keep it mapped until then."""
    storage = t.untyped_storage()
    (dev, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = storage._share_cuda_()
    b64 = lambda b: base64.b64encode(b).decode() if b else None  # noqa: E731
    return {"device": dev, "handle": b64(handle), "size": size, "offset": offset, "ref_handle": b64(ref_handle),
            "ref_offset": ref_offset, "event_handle": b64(event_handle), "event_sync": event_sync,
            "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "stride": list(t.stride()),
            "storage_offset": t.storage_offset(), "stable": bool(stable)}


def describe_all(tensors: list, stable: bool = False) -> list[dict | None]:
    """describe() for each tensor (None for what is no tensor), sharing each storage once: every share of a storage
    is counted until the other process maps and drops it once, so a storage shared twice and mapped once (two outputs
    viewing one buffer) would never be freed. Views of one storage get the same handle with their own layout."""
    shared: dict[int, dict] = {}
    descs: list[dict | None] = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            descs.append(None)
            continue
        base = shared.get(t.untyped_storage().data_ptr())
        if base is None:
            descs.append(shared.setdefault(t.untyped_storage().data_ptr(), describe(t, stable)))
        else:
            descs.append(dict(base, dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape),
                              stride=list(t.stride()), storage_offset=t.storage_offset()))
    return descs


def open_storage(desc: dict) -> torch.UntypedStorage:
    """The other process's storage behind a description, mapped here (nothing is copied)."""
    unb64 = lambda s: base64.b64decode(s) if s else None  # noqa: E731
    return torch.UntypedStorage._new_shared_cuda(
        desc["device"], unb64(desc["handle"]), desc["size"], desc["offset"], unb64(desc["ref_handle"]),
        desc["ref_offset"], unb64(desc["event_handle"]), desc["event_sync"])


def open_view(desc: dict, storage: torch.UntypedStorage | None = None) -> torch.Tensor:
    """The tensor `describe` described, viewing the other process's memory (nothing is copied); `storage`: one
    already mapped by open_storage(desc)."""
    storage = storage if storage is not None else open_storage(desc)
    dtype = getattr(torch, desc["dtype"])
    return torch.empty(0, dtype=dtype, device=f"cuda:{desc['device']}").set_(
        storage, desc["storage_offset"], desc["shape"], desc["stride"])
