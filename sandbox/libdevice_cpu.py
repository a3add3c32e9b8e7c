"""Triton's CPU interpreter made to compute as compiled Triton does on a GPU, for the interpreter executor.

libdevice: the interpreter has none (its libdevice functions return None there). The executor binds a kernel's
libdevice alias to this module. Each function computes on the numpy array behind an interpreter tensor, in the
tensor's own dtype (bf16 in fp32, rounded back); rounding-mode variants (`_rn`, `_rz`, ...) round to nearest. The
fast-math functions (`fast_expf`, `fast_sinf`, ...) are computed as the GPU's: in fp32 through the hardware
approximations they compile to (ex2.approx, lg2.approx, sin.approx, cos.approx, tanh.approx, rcp.approx), each
rounded to that instruction's documented accuracy, so a kernel that leans on their error fails here as on a GPU.
Functions that cannot be written this way raise, so a kernel using them fails loudly instead of computing None.

`gpu_numerics()` patches the interpreter (in the executor only) where it computes otherwise than compiled Triton:
bf16 arithmetic, comparisons, reductions and `tl.dot` on bf16 operate on raw bit patterns there (triton-lang/triton
#5424): they compute in fp32 and round to bf16 as the GPU's bf16 instructions do; an fp32 `tl.dot` at Triton's
default input precision (tf32) drops the operands' low 13 mantissa bits as the tensor cores do; a comparison of
scalars is typed int1, so a mask that combines it with a block test loads. `fp32_scalar` is how a float argument
reaches a kernel: compiled Triton passes fp32, the interpreter a Python float (`scalar_argument`: ints past int32
as int64 too).
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
    "exp10": lambda x: np.power(10.0, x), "exp2": np.exp2, "expm1": np.expm1, "floor": np.floor, "isinf": np.isinf, "isnan": np.isnan, "lgamma": _lgamma, "log": np.log, "log10": np.log10,
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
    "hypot": np.hypot, "nextafter": np.nextafter, "pow": np.power, "remainder": np.remainder, "fmax": np.fmax, "fmin": np.fmin,
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
        values = [_wide(a.handle).data if isinstance(a, tl.tensor) else a for a in args]
        with np.errstate(all="ignore"):
            out = np.asarray(fn(*values))
        if out.dtype == np.bool_:
            return tl.tensor(TensorHandle(out, tl.int1), _retyped(like.type, tl.int1))
        if like.handle.dtype.scalar == tl.bfloat16:
            return tl.tensor(TensorHandle(_to_bf16(out), tl.bfloat16), like.type)
        out = out.astype(like.handle.data.dtype)
        return tl.tensor(TensorHandle(out, like.handle.dtype), like.type)
    return apply


# -- fast math as the GPU computes it --------------------------------------------------------------------------
def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _ftz(x):
    """.ftz: subnormal fp32 results flush to zero."""
    x = _f32(x)
    return np.where(np.abs(x) < np.float32(2.0**-126), np.float32(0) * x, x)


def _relative(y, bits: int):
    """y rounded to `bits` fraction bits: a relative error up to 2^-(bits+1), an approximation's accuracy."""
    mantissa, exponent = np.frexp(np.asarray(y, dtype=np.float64))
    return np.ldexp(np.round(mantissa * 2.0 ** (bits + 1)) / 2.0 ** (bits + 1), exponent)


def _absolute(y, bits: int):
    """y rounded to a grid of 2^-bits: an absolute error up to 2^-(bits+1)."""
    return np.round(np.asarray(y, dtype=np.float64) * 2.0**bits) / 2.0**bits


def _ex2(x):     # ex2.approx.ftz.f32: relative error about 2^-23 (2 ulp)
    return _ftz(_relative(np.exp2(_f32(x).astype(np.float64)), 22))


def _lg2(x):     # lg2.approx.ftz.f32: absolute error about 2^-22
    return _f32(_absolute(np.log2(_ftz(x).astype(np.float64)), 21))


def _turns(x):
    """sin.approx/cos.approx compile to FMUL.RZ by 1/(2 pi) then MUFU.SIN/COS on turns: the product is rounded
    toward zero to fp32, so a large |x| loses its fraction of a turn."""
    exact = _ftz(x).astype(np.float64) * np.float64(np.float32(1 / (2 * math.pi)))
    rounded = exact.astype(np.float32)
    toward_zero = np.where(np.abs(rounded) > np.abs(exact), np.nextafter(rounded, np.float32(0)), rounded)
    return toward_zero.astype(np.float64) * (2 * math.pi)


def _sin(x):     # MUFU.SIN: absolute error about 2^-23; with the reduction, CUDA's 2^-21.41 on [-pi, pi]
    return _f32(_absolute(np.sin(_turns(x)), 22))


def _cos(x):
    return _f32(_absolute(np.cos(_turns(x)), 22))


def _rcp(x):     # rcp.approx.ftz.f32: about 1 ulp
    return _ftz(_relative(1.0 / _ftz(x).astype(np.float64), 22))


FAST = {
    "fast_expf": lambda x: _ex2(_f32(x) * np.float32(math.log2(math.e))),
    "fast_exp10f": lambda x: _ex2(_f32(x) * np.float32(math.log2(10))),
    "fast_logf": lambda x: _lg2(x) * np.float32(math.log(2)),
    "fast_log2f": _lg2,
    "fast_log10f": lambda x: _lg2(x) * np.float32(math.log10(2)),
    "fast_sinf": _sin,
    "fast_cosf": _cos,
    "fast_tanf": lambda x: _sin(x) * _rcp(_cos(x)),
    "fast_tanhf": lambda x: _f32(_relative(np.tanh(_f32(x).astype(np.float64)), 10)),  # tanh.approx: 2^-11
}
UNARY.update(FAST)
BINARY["fast_powf"] = lambda x, y: _ex2(_f32(y) * _lg2(x))
# __fdividef: x * rcp(y), and 0 where |y| is in (2^126, 2^128)
BINARY["fast_dividef"] = lambda x, y: np.where(np.abs(_f32(y)) > np.float32(2.0**126), np.float32(0) * _f32(x),
                                               _f32(x) * _rcp(y))

for _table, _arity in ((UNARY, 1), (BINARY, 2), (TERNARY, 3)):
    for _name, _fn in _table.items():
        globals()[_name] = _wrap(_fn, _arity)


# -- the interpreter's arithmetic as compiled Triton's ---------------------------------------------------------
def _to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (the interpreter keeps bf16 as uint16) as the fp32 values they are."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _to_bf16(x) -> np.ndarray:
    """fp32 values rounded to nearest even bf16, as bit patterns; a NaN stays a NaN."""
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def _wide(handle: TensorHandle) -> TensorHandle:
    return TensorHandle(_to_f32(handle.data), tl.float32) if handle.dtype.scalar == tl.bfloat16 else handle


def _retyped(ty, element):
    return ty.with_element_ty(element) if isinstance(ty, tl.block_type) else element


def _bf16_in_fp32(method, rounds: int | None = None):
    """A builder method that computes bf16 operands in fp32 and rounds an fp32 result back to bf16 (only where
    operand `rounds` was bf16, when given: a dot's accumulator decides its result's type)."""
    def run(self, *args):
        narrow = [isinstance(a, TensorHandle) and a.dtype.scalar == tl.bfloat16 for a in args]
        if not any(narrow):
            return method(self, *args)
        out = method(self, *[_wide(a) if n else a for a, n in zip(args, narrow)])
        back = any(narrow) if rounds is None else narrow[rounds]
        if back and isinstance(out, TensorHandle) and out.data.dtype == np.float32:
            return TensorHandle(_to_bf16(out.data), tl.bfloat16)
        return out
    return run


def _typed_int1(method):
    def run(self, *args):
        out = method(self, *args)
        return TensorHandle(out.data, tl.int1)
    return run


def _cast(method):
    """Casts to and from bf16 through fp32 (the interpreter converts only bf16 <-> fp32 itself), and fp32 to bf16
    rounded to nearest even, as cvt.rn.bf16.f32 does (the interpreter's conversion rounds otherwise)."""
    def run(self, src, dst_type):
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar not in (tl.bfloat16, tl.float32):
            src = method(self, src, tl.float32)
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar != tl.bfloat16:
            if src.dtype.scalar != tl.float32:
                src = method(self, src, tl.float32)
            return TensorHandle(_to_bf16(src.data), tl.bfloat16)
        return method(self, src, dst_type)
    return run


def _dot(method):
    """bf16 operands multiply exactly and accumulate in fp32; fp32 operands at input precision tf32 keep the 10
    mantissa bits the tensor cores read (the low 13 dropped)."""
    from triton._C.libtriton import ir

    def run(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.dtype.scalar == tl.float32:
            a, b = (TensorHandle((h.data.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32), h.dtype)
                    for h in (a, b))
        return method(self, a, b, d, input_precision, max_num_imprecise_acc)
    return _bf16_in_fp32(run, rounds=2)


def _reduce_in_fp32(method):
    """tl.sum / tl.max / tl.min of bf16: the interpreter reduces the bit patterns; here the values, in fp32."""
    def run(self, input, *args, **kwargs):
        value = input[0] if isinstance(input, tuple) else input
        if value.dtype.scalar != tl.bfloat16:
            return method(self, input, *args, **kwargs)
        wide = tl.tensor(_wide(value.handle), _retyped(value.type, tl.float32))
        out = method(self, wide, *args, **kwargs)

        def narrow(t):
            if isinstance(t, tl.tensor) and t.dtype.scalar == tl.float32:
                return tl.tensor(TensorHandle(_to_bf16(t.handle.data), tl.bfloat16), _retyped(t.type, tl.bfloat16))
            return t
        return tuple(narrow(t) for t in out) if isinstance(out, tuple) else narrow(out)
    return run


FLOAT_OPS = ("fadd", "fmul", "fdiv", "frem", "fsub", "fneg", "precise_divf", "approx_divf", "minimumf", "minnumf",
             "maximumf", "maxnumf", "fma", "clampf", "cos", "exp", "exp2", "log", "log2", "precise_sqrt", "sqrt",
             "sin", "erf", "rsqrt", "floor", "ceil")
COMPARISONS = [f"icmp{c}" for c in ("SLE", "SLT", "SGE", "SGT", "ULE", "ULT", "UGE", "UGT", "EQ", "NE")] + \
    [f"fcmp{o}{c}" for o in "OU" for c in ("LT", "GT", "LE", "GE", "EQ", "NE")]


def interpreter_compat() -> None:
    """Triton's interpreter, in this process, taking a one-element block as an index as Triton 3.9's does (the
    tutorials' persistent loop `tl.range(tl.program_id(0), n_rows, tl.num_programs(0))`): Triton 3.6's takes int()
    of a 1-d array, which NumPy 2 refuses, so an honest kernel that a GPU runs failed on the CPU."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "kloop_index", False):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.kloop_index = True
    interpreter._patch_lang_tensor = patched


def gpu_numerics() -> None:
    """Patch Triton's interpreter in this process (the interpreter executor's) to compute as compiled Triton."""
    from triton.runtime import interpreter

    interpreter_compat()
    builder = interpreter.InterpreterBuilder
    if getattr(builder, "kloop_gpu_numerics", False):
        return
    # an op this Triton's interpreter does not have (3.6 has no create_fneg) has nothing to wrap
    present = [name for name in FLOAT_OPS + tuple(COMPARISONS) if hasattr(builder, f"create_{name}")]
    for name in COMPARISONS:   # typed int1 before the bf16 wrap, which then sees a boolean result
        setattr(builder, f"create_{name}", _typed_int1(getattr(builder, f"create_{name}")))
    for name in present:
        setattr(builder, f"create_{name}", _bf16_in_fp32(getattr(builder, f"create_{name}")))
    builder.cast_impl = _cast(builder.cast_impl)
    builder.create_dot = _dot(builder.create_dot)
    reduce_ops = interpreter.ReduceOps
    reduce_ops.sum = _reduce_in_fp32(reduce_ops.sum)
    reduce_ops.min_max = _reduce_in_fp32(reduce_ops.min_max)
    builder.kloop_gpu_numerics = True


def fp32_scalar(value: float) -> tl.tensor:
    """A float kernel argument as compiled Triton passes it: an fp32 scalar (`eps.to(tl.float32)` works)."""
    return tl.tensor(TensorHandle(np.array([value], dtype=np.float32), tl.float32), tl.float32)


def scalar_argument(value, ty: str):
    """A recorded scalar as compiled Triton passes it: floats as fp32, ints past int32 as int64 (the interpreter
    makes [2^31, 2^32) a uint32); int32 and bool the interpreter already passes as Triton does."""
    if ty == "fp32":
        return fp32_scalar(value)
    if ty == "i64":
        return tl.tensor(TensorHandle(np.array([value], dtype=np.int64), tl.int64), tl.int64)
    return value


def __getattr__(name: str):
    raise AttributeError(f"libdevice.{name} has no version under kloop's CPU interpreter; it needs a GPU")
