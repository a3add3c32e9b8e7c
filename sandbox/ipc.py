"""GPU buffers the trusted evaluator lends a worker for its outputs (CUDA IPC), described in plain JSON.

The trusted side allocates and owns the memory, so it never opens a handle a candidate made, and nothing crosses the
pipe but bytes and integers; 256 MiB of output then costs a device copy instead of a trip through host files.
"""
from __future__ import annotations

import base64

import torch


def share_buffer(nbytes: int, device: torch.device) -> tuple[torch.Tensor, dict]:
    """A buffer and the JSON description a worker needs to write into it (the lender poisons it before each use)."""
    buf = torch.empty((nbytes,), dtype=torch.uint8, device=device)
    (dev, handle, size, offset, ref_handle, ref_offset, event_handle, event_sync) = buf.untyped_storage()._share_cuda_()
    b64 = lambda b: base64.b64encode(b).decode() if b else None  # noqa: E731
    return buf, {"device": dev, "handle": b64(handle), "size": size, "offset": offset, "ref_handle": b64(ref_handle),
                 "ref_offset": ref_offset, "event_handle": b64(event_handle), "event_sync": event_sync,
                 "nbytes": nbytes}


_opened: dict[str, torch.Tensor] = {}


def open_shared_buffer(desc: dict) -> torch.Tensor:
    """The worker's view of a lent buffer, as a flat uint8 tensor; each handle is opened once per process."""
    key = f"{desc['handle']}:{desc['offset']}:{desc['nbytes']}"  # one allocation may hold several buffers
    if key in _opened:
        return _opened[key]
    unb64 = lambda s: base64.b64decode(s) if s else None  # noqa: E731
    storage = torch.UntypedStorage._new_shared_cuda(
        desc["device"], unb64(desc["handle"]), desc["size"], desc["offset"], unb64(desc["ref_handle"]),
        desc["ref_offset"], unb64(desc["event_handle"]), desc["event_sync"])
    view = torch.empty(0, dtype=torch.uint8, device=f"cuda:{desc['device']}").set_(storage, 0, (desc["nbytes"],), (1,))
    _opened[key] = view
    return view
