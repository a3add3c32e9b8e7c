"""libdevice for Triton's CPU interpreter, which has none (its libdevice functions return None there).

The interpreter executor binds a kernel's libdevice alias to this module. Each function computes on the numpy array
behind an interpreter tensor, in the tensor's own dtype; rounding-mode variants (`_rn`, `_rz`, ...) round to nearest.
Functions that cannot be written this way raise, so a kernel using them fails loudly instead of computing None.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _erfinv(x):
    return torch.special.erfinv(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()

_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
_gamma = np.vectorize(math.gamma, otypes=[np.float64])

UNARY = {
    "abs": np.abs, "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "cbrt": np.cbrt, "ceil": np.ceil, "cos": np.cos, "cosh": np.cosh,
    "cospi": lambda x: np.cos(np.pi * x), "erf": _erf, "erfc": lambda x: 1.0 - _erf(x), "exp": np.exp,
    "exp10": lambda x: np.power(10.0, x), "exp2": np.exp2, "expm1": np.expm1, "fast_cosf": np.cos,
    "fast_exp10f": lambda x: np.power(10.0, x), "fast_expf": np.exp, "fast_log10f": np.log10,
    "fast_log2f": np.log2, "fast_logf": np.log, "fast_sinf": np.sin, "fast_tanf": np.tan, "fast_tanhf": np.tanh,
    "floor": np.floor, "isinf": np.isinf, "isnan": np.isnan, "lgamma": _lgamma, "log": np.log, "log10": np.log10,
    "log1p": np.log1p, "log2": np.log2, "nearbyint": np.rint, "normcdf": lambda x: 0.5 * (1.0 + _erf(x / math.sqrt(2))),
    "rcbrt": lambda x: 1.0 / np.cbrt(x), "rint": np.rint, "round": lambda x: np.sign(x) * np.floor(np.abs(x) + 0.5),
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "rsqrt_rn": lambda x: 1.0 / np.sqrt(x), "saturatef": lambda x: np.clip(x, 0, 1),
    "signbit": np.signbit, "sin": np.sin, "sinh": np.sinh, "sinpi": lambda x: np.sin(np.pi * x), "sqrt": np.sqrt,
    "tan": np.tan, "tanh": np.tanh, "tgamma": _gamma, "trunc": np.trunc, "finitef": np.isfinite,
    "isfinited": np.isfinite, "erfinv": _erfinv, "erfcinv": lambda x: _erfinv(1.0 - x),
    "normcdfinv": lambda x: math.sqrt(2) * _erfinv(2.0 * x - 1.0),
}
for _mode in ("rn", "rz", "rd", "ru"):
    UNARY[f"sqrt_{_mode}"] = np.sqrt
    UNARY[f"rcp_{_mode}"] = lambda x: 1.0 / x

BINARY = {
    "atan2": np.arctan2, "copysign": np.copysign, "fdim": lambda x, y: np.maximum(x - y, 0), "fmod": np.fmod,
    "hypot": np.hypot, "nextafter": np.nextafter, "pow": np.power, "fast_powf": np.power,
    "fast_dividef": np.divide, "remainder": np.remainder, "fmax": np.fmax, "fmin": np.fmin,
    "ldexp": lambda x, e: np.ldexp(x, np.asarray(e, dtype=np.int32)),
}
for _mode in ("rn", "rz", "rd", "ru"):
    for _name, _fn in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide)):
        BINARY[f"{_name}_{_mode}"] = _fn

TERNARY = {"fma": lambda x, y, z: x * y + z}
for _mode in ("rn", "rz", "rd", "ru"):
    TERNARY[f"fma_{_mode}"] = TERNARY["fma"]


def _wrap(fn, arity: int):
    def apply(*args, **kwargs):
        args = [a for a in args][:arity]
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        if not tensors:
            raise TypeError("libdevice functions take Triton tensors")
        like = tensors[0]
        values = [a.handle.data if isinstance(a, tl.tensor) else a for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*values))
        if out.dtype == np.bool_:
            return tl.tensor(TensorHandle(out, tl.int1), like.type.with_element_ty(tl.int1)
                             if hasattr(like.type, "with_element_ty") else tl.int1)
        out = out.astype(like.handle.data.dtype)
        return tl.tensor(TensorHandle(out, like.handle.dtype), like.type)
    return apply


for _table, _arity in ((UNARY, 1), (BINARY, 2), (TERNARY, 3)):
    for _name, _fn in _table.items():
        globals()[_name] = _wrap(_fn, _arity)


def __getattr__(name: str):
    raise AttributeError(f"libdevice.{name} has no version under kloop's CPU interpreter; it needs a GPU")
