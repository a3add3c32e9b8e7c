"""The launch plan: what a candidate's `forward` does at one shape, as data a trusted executor can replay.

A planner process (sandbox/planner.py) runs the candidate's Python once per shape and writes a plan; it is
untrusted, so `load_plan` treats the file as hostile input: size-capped, schema-checked field by field, every
reference and byte range checked against the buffers the plan declares. Nothing in a plan is executed as Python on
the GPU path: kernels travel as Triton cache entries (cubin + metadata) or PTX text, run through Triton's own
launcher or CuPy. On the CPU path kernels travel as Triton-language source, which the trusted side checks with
tools.rules.check_jit_function before the (jailed) interpreter executor may run it.

    plan = load_plan(path)                # raises PlanError (one line) on anything malformed
    plan.steps[0]                         # Fill(...) or Launch(...)

Buffers are referred to as (kind, index): ("input", i) is argument i of forward, ("alloc", k) the k-th allocation
forward made, ("state", s) memory that existed before the call (parameters, buffers, cached workspaces), whose bytes
travel with the plan.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

VERSION = 3                      # 2: state in parts (a list of blobs); 3: choose steps (autotuned launches)
PLAN_FILE = "plan.json"
MAX_PLAN_JSON = 32 << 20         # the JSON itself (sources, PTX, metadata); blobs are separate files
MAX_BLOBS_BYTES = 64 << 30       # cubins and state snapshots together (KernelBench's widest MLP holds 8 GiB)
STATE_PART_BYTES = 1 << 30       # a state snapshot's part, at most (and at most half the file-size limit)
# launches and fills of one forward: a recurrence launches a kernel per time step, layer and direction (KernelBench
# level 3's bidirectional 6-layer LSTM and GRUs over 512 steps: about 6200); the JSON bound caps a plan's size too
MAX_STEPS = 32768
MAX_KERNELS = 256
MAX_OPTIONS = 64                 # configurations of one autotuned launch (a choose step's options)
MAX_BUFFERS = 4096
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2")
ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2, "int8": 1,
            "uint8": 1, "bool": 1, "uint16": 2, "uint32": 4, "uint64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}
BUFFER_KINDS = ("input", "alloc", "state")
JIT_CONSTEXPR = "kloop-jit:"   # an interpreted kernel's constexpr argument that is one of its jit functions, by name
# Scalar kernel parameter types, as Triton's signatures and numpy (PTX launches) name them.
INT_TYPES = {"i1": (0, 1), "i8": (-2**7, 2**7 - 1), "i16": (-2**15, 2**15 - 1), "i32": (-2**31, 2**31 - 1),
             "i64": (-2**63, 2**63 - 1), "u1": (0, 1), "u8": (0, 2**8 - 1), "u16": (0, 2**16 - 1),
             "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1)}
FLOAT_TYPES = ("fp16", "bf16", "fp32", "f32", "fp64")
# Element types as Triton's signatures name them, as plan dtypes.
TRITON_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "fp64": "float64", "i64": "int64",
                 "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8", "i1": "bool", "u16": "uint16",
                 "u32": "uint32", "u64": "uint64", "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2"}
_POINTER_SIG = re.compile(r"\*k?[a-z0-9]{1,16}")
_TENSORDESC_SIG = re.compile(r"tensordesc<(" + "|".join(TRITON_DTYPES) + r")\[(\d+(?:, ?\d+){0,4})\]>")
KERNEL_KINDS = ("triton", "interpreted", "ptx")
MAX_GRID = (2**31 - 1, 65535, 65535)
MAX_SCRATCH = 1 << 32            # Triton global scratch of one launch (device-side TMA descriptors use 128 B/program)
# What the trusted side assembles and loads for one plan's PTX: ptxas runs in the executor, and a module's .global
# variables are allocated when it loads, so a candidate could otherwise keep an evaluation busy for minutes (large,
# slow-to-assemble texts swapped in) or take gigabytes of the GPU (.global arrays) from its neighbours.
MAX_PTX_BYTES = 4 << 20          # the plan's distinct PTX texts together
MAX_PTX_MODULES = 16             # distinct PTX texts
MAX_PTX_GLOBAL_BYTES = 256 << 20  # .global variables declared by them together
_PTX_GLOBAL = re.compile(r"\.global\s+(?:\.align\s+\d+\s+)?(?:\.v\d\s+)?\.([a-z]\d+)\s+[\w$%]+\s*((?:\[\s*\d*\s*\])*)")


class PlanError(ValueError):
    """The plan is malformed; the message is one line and never echoes hidden shapes."""


@dataclass(frozen=True)
class Ref:
    kind: str
    index: int

    def key(self) -> tuple[str, int]:
        return (self.kind, self.index)


@dataclass
class Pointer:
    ref: Ref | None            # None: a null pointer
    offset: int = 0            # bytes from the buffer's start
    dtype: str = "uint8"       # element type (the interpreter needs it; Triton's cubin has it in its signature)


@dataclass
class Scalar:
    value: int | float | bool
    type: str                  # an INT_TYPES or FLOAT_TYPES key


@dataclass
class Constexpr:
    value: object              # JSON value; Triton's launcher ignores it, the interpreter passes it by name


@dataclass
class Descriptor:
    """A host-side TMA tensor descriptor (triton.tools.tensor_descriptor.TensorDescriptor) over a buffer: the
    executor builds its own from these fields, and only after they were checked to stay inside the buffer."""
    base: Pointer
    shape: list[int]
    strides: list[int]          # in elements, the last one 1
    block_shape: list[int]
    padding: str = "zero"


@dataclass
class Kernel:
    kind: str                  # triton (cubin), interpreted (source, CPU), ptx (text)
    name: str
    source: str = ""           # the kernel's source (Triton) for people and data; PTX text for ptx kernels
    hash: str = ""             # Triton cache key
    metadata: dict = field(default_factory=dict)          # Triton's metadata JSON
    blob: str | None = None    # file name of the cubin (triton)
    ptx: str = ""
    signature: dict = field(default_factory=dict)         # arg name -> Triton type string ("*fp32", "i32", "constexpr")
    arg_names: list[str] = field(default_factory=list)
    functions: dict = field(default_factory=dict)         # interpreted: function name -> source
    constants: dict = field(default_factory=dict)         # interpreted: module constant name -> JSON literal
    aliases: dict = field(default_factory=dict)           # interpreted: local name -> module (tl, libdevice, ...)


@dataclass
class Fill:
    ref: Ref
    offset: int
    dtype: str
    shape: list[int]
    stride: list[int]
    value: float | int | bool


@dataclass
class Launch:
    kernel: int
    grid: list[int]
    args: list                 # every parameter in order, constexprs included
    block: list[int] = field(default_factory=lambda: [1, 1, 1])   # ptx
    shared: int = 0                                        # ptx dynamic shared bytes
    scratch: Ref | None = None  # triton: the allocation serving as the kernel's global scratch (device-side TMA
                                # descriptors live there), checked to hold what the kernel's metadata asks for


@dataclass
class Choose:
    """An autotuned launch: one option (its steps: fills and launches) per configuration the autotuner would have
    timed. Every choose step of one `site` (one autotuner at one key) runs the same option; the trusted executor
    times the options and picks (sandbox/executor.py), so no candidate code times anything on a GPU."""
    site: int
    options: list[list]        # each a list of Fill and Launch


@dataclass
class InputSpec:
    dtype: str | None = None   # None: a Python scalar input
    shape: list[int] = field(default_factory=list)
    stride: list[int] = field(default_factory=list)
    nbytes: int = 0
    value: object = None


@dataclass
class OutputSpec:
    ref: Ref
    offset: int
    dtype: str
    shape: list[int]
    stride: list[int]


@dataclass
class Plan:
    inputs: list[InputSpec]
    allocs: list[int]          # bytes of each allocation made in forward
    state: list[dict]          # {"nbytes": n, "blobs": [file name of each part, in order]}
    kernels: list[Kernel]
    steps: list
    outputs: list[OutputSpec]
    directory: Path | None = None

    def nbytes(self, ref: Ref) -> int:
        if ref.kind == "input":
            return self.inputs[ref.index].nbytes
        if ref.kind == "alloc":
            return self.allocs[ref.index]
        return self.state[ref.index]["nbytes"]

    def blob_path(self, name: str) -> Path:
        return self.directory / name

    def flat_steps(self) -> list:
        """Every Fill and Launch, those of every choose step's options included."""
        return [inner for s in self.steps
                for inner in ([x for option in s.options for x in option] if isinstance(s, Choose) else [s])]

    def launches(self) -> list[Launch]:
        return [s for s in self.flat_steps() if isinstance(s, Launch)]

    def sites(self) -> list[int]:
        """Options per autotuned site, by site index."""
        counts: dict[int, int] = {}
        for s in self.steps:
            if isinstance(s, Choose):
                counts[s.site] = len(s.options)
        return [counts[i] for i in range(len(counts))]


# -- writing (the planner side) ---------------------------------------------------------------------------------------
def state_part_bytes() -> int:
    """How large a part of a state snapshot this process writes: STATE_PART_BYTES, or half its RLIMIT_FSIZE when
    that is lower (the jail's limit guards the disk against a runaway output, not against a large weight)."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return STATE_PART_BYTES if limit == resource.RLIM_INFINITY else max(1, min(STATE_PART_BYTES, limit // 2))


def dump(plan: dict, directory: Path) -> Path:
    """Write a plan's JSON (blobs are written by the caller beside it). Used by the untrusted planner."""
    path = Path(directory) / PLAN_FILE
    path.write_text(json.dumps(plan))
    return path


# -- reading (the trusted side) ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _untrusted(path: Path, limit: int, exact: int | None = None):
    """(fd, size) of a file an untrusted process wrote: a regular file (no symlink, FIFO or device), opened without
    blocking, its size checked against `limit` (and `exact`) before anything is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise PlanError(f"cannot open {Path(path).name}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PlanError(f"{Path(path).name} is not a regular file")
        if info.st_size > limit:
            raise PlanError(f"{Path(path).name} holds {info.st_size} bytes, more than the {limit} allowed")
        if exact is not None and info.st_size != exact:
            raise PlanError(f"{Path(path).name} holds {info.st_size} bytes, expected exactly {exact}")
        yield fd, info.st_size
    finally:
        os.close(fd)


def read_untrusted(path: Path, limit: int, exact: int | None = None) -> bytes:
    """Bytes of a file an untrusted process wrote (`_untrusted`'s checks)."""
    with _untrusted(path, limit, exact) as (fd, size):
        chunks, left = [], size
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 24))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) != size:
            raise PlanError(f"{Path(path).name} changed size while it was read")
        return data


def read_untrusted_into(path: Path, buffer: memoryview) -> int:
    """A file an untrusted process wrote (`_untrusted`'s checks), read straight into `buffer` (at most its length):
    the bytes read. A state part of a gigabyte goes to its tensor without the copies of `read_untrusted`."""
    with _untrusted(path, len(buffer)) as (fd, size):
        done = 0
        while done < size:
            n = os.readv(fd, [buffer[done:size]])
            if n == 0:
                raise PlanError(f"{Path(path).name} changed size while it was read")
            done += n
        return size


def _copy_untrusted(source: Path, destination: Path, limit: int) -> int:
    """A file an untrusted process wrote (`_untrusted`'s checks) copied in the kernel (sendfile: no bytes through
    Python; level 3's widest MLP holds 6 GB of weights), exactly its size when opened: the bytes copied."""
    with _untrusted(source, limit) as (fd, size):
        with open(destination, "wb") as out:
            done = 0
            while done < size:
                n = os.sendfile(out.fileno(), fd, done, min(size - done, 1 << 30))
                if n == 0:
                    raise PlanError(f"{Path(source).name} changed size while it was read")
                done += n
        return size


def copy_plan(source: Path, destination: Path) -> None:
    """Copy the files of a plan out of an untrusted process's directory into one of ours: the directory must be a
    real directory (no symlink), and only regular files with plan names are copied, each size-capped."""
    source, destination = Path(source), Path(destination)
    try:
        info = os.lstat(source)
    except OSError:
        raise PlanError("the planner wrote no plan") from None
    if not stat.S_ISDIR(info.st_mode):
        raise PlanError("the plan's directory is not a directory")
    names = sorted(os.listdir(source))
    if len(names) > 2 * MAX_BUFFERS:
        raise PlanError("the plan's directory holds too many files")
    destination.mkdir(parents=True, exist_ok=True)
    total = 0
    for name in names:
        if name != PLAN_FILE and not (name.startswith(("kernel-", "state-")) and name.endswith((".cubin", ".bin"))):
            continue
        total += _copy_untrusted(source / name, destination / name,
                                 MAX_PLAN_JSON if name == PLAN_FILE else MAX_BLOBS_BYTES)
        if total > MAX_BLOBS_BYTES:
            raise PlanError("the plan's binaries and state exceed the size limit")


def _check_ptx_budget(kernels: list) -> None:
    """The plan's PTX within MAX_PTX_BYTES, MAX_PTX_MODULES and MAX_PTX_GLOBAL_BYTES of declared .global data."""
    texts = {k.ptx for k in kernels if k.kind == "ptx"}
    if len(texts) > MAX_PTX_MODULES:
        raise PlanError(f"the plan has {len(texts)} distinct PTX modules, over {MAX_PTX_MODULES}")
    size = sum(len(t) for t in texts)
    if size > MAX_PTX_BYTES:
        raise PlanError(f"the plan's PTX holds {size} bytes, over {MAX_PTX_BYTES}")
    declared = sum(ptx_global_bytes(t) for t in texts)
    if declared > MAX_PTX_GLOBAL_BYTES:
        raise PlanError(f"the plan's PTX declares {declared} bytes of .global memory, over {MAX_PTX_GLOBAL_BYTES} "
                        "(allocate buffers in forward instead)")


def ptx_global_bytes(ptx: str) -> int:
    """Bytes of the .global variables a PTX text declares (their element type's size times their dimensions)."""
    total = 0
    for kind, dims in _PTX_GLOBAL.findall(ptx):
        count = 1
        for dim in re.findall(r"\[\s*(\d*)\s*\]", dims):
            count *= int(dim) if dim else 1
        total += count * max(1, int(re.sub(r"\D", "", kind) or 8) // 8)
    return total


def load_plan(path: Path) -> Plan:
    """Parse and check a plan written by an untrusted planner. Raises PlanError with one line."""
    path = Path(path)
    try:
        raw = json.loads(read_untrusted(path, MAX_PLAN_JSON))
    except (ValueError, RecursionError) as e:
        raise PlanError(f"the plan is not valid JSON ({str(e)[:80]})") from None
    return _PlanReader(path.parent).plan(raw)


def _blob_name(value) -> str:
    if not isinstance(value, str) or not value or "/" in value or value.startswith(".") or len(value) > 128:
        raise PlanError("a blob name must be a plain file name")
    return value


class _PlanReader:
    """load_plan's reader: the plan's JSON checked field by field as hostile input, the files it names looked up in
    `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.blob_bytes = 0

    def plan(self, raw) -> Plan:
        d = _obj(raw, "plan")
        if d.get("version") != VERSION:
            raise PlanError(f"plan version {d.get('version')!r} is not {VERSION}")
        inputs = [self.input(x) for x in _list(d.get("inputs"), "inputs", MAX_BUFFERS)]
        allocs = [_int(x, "alloc size", 0, 1 << 40) for x in _list(d.get("allocs"), "allocs", MAX_BUFFERS)]
        state = [self.state(x) for x in _list(d.get("state"), "state", MAX_BUFFERS)]
        kernels = [self.kernel(x) for x in _list(d.get("kernels"), "kernels", MAX_KERNELS)]
        _check_ptx_budget(kernels)
        plan = Plan(inputs=inputs, allocs=allocs, state=state, kernels=kernels, steps=[], outputs=[],
                    directory=self.directory)
        self.current = plan
        self.steps_read, self.site_options = 0, {}
        plan.steps = [self.step(x, outer=True) for x in _list(d.get("steps"), "steps", MAX_STEPS)]
        if sorted(self.site_options) != list(range(len(self.site_options))):
            raise PlanError("choose steps' sites must be numbered 0, 1, ... in the plan")
        plan.outputs = [self.output(x) for x in _list(d.get("outputs"), "outputs", 64)]
        if not plan.outputs:
            raise PlanError("forward returned no tensor")
        return plan

    def input(self, raw) -> InputSpec:
        d = _obj(raw, "input")
        if d.get("dtype") is None:
            return InputSpec(value=_json_scalar(d.get("value"), "scalar input"))
        spec = InputSpec(dtype=_dtype(d["dtype"]), shape=_ints(d.get("shape"), "input shape"),
                         stride=_ints(d.get("stride"), "input stride"), nbytes=_int(d.get("nbytes"), "input bytes",
                                                                                     0, 1 << 40))
        return spec

    def state(self, raw) -> dict:
        d = _obj(raw, "state")
        nbytes = _int(d.get("nbytes"), "state size", 0, 1 << 40)
        names = [_blob_name(name) for name in _list(d.get("blobs"), "state blobs", MAX_BUFFERS)]
        if not names or len(set(names)) != len(names):
            raise PlanError("a state needs one or more distinct blobs")
        sizes = [self._blob(name) for name in names]
        if sum(sizes) != nbytes:
            raise PlanError(f"the blobs of a state hold {sum(sizes)} bytes, not its {nbytes}")
        return {"nbytes": nbytes, "blobs": names}

    def _blob(self, name: str, nbytes: int | None = None) -> int:
        path = self.directory / name
        try:
            info = os.lstat(path)
        except OSError:
            raise PlanError(f"blob {name} is missing") from None
        if not stat.S_ISREG(info.st_mode) or (nbytes is not None and info.st_size != nbytes):
            raise PlanError(f"blob {name} is not a regular file" + (f" of {nbytes} bytes" if nbytes is not None
                                                                     else ""))
        self.blob_bytes += info.st_size
        if self.blob_bytes > MAX_BLOBS_BYTES:
            raise PlanError("the plan's binaries and state exceed the size limit")
        return info.st_size

    def kernel(self, raw) -> Kernel:
        d = _obj(raw, "kernel")
        kind = d.get("kind")
        if kind not in KERNEL_KINDS:
            raise PlanError(f"unknown kernel kind {kind!r}")
        k = Kernel(kind=kind, name=_ident(d.get("name"), "kernel name"), source=_text(d.get("source", ""), "source"))
        if kind == "triton":
            k.hash = _text(d.get("hash"), "kernel hash", 256)
            if not k.hash.replace("-", "").replace("_", "").isalnum():
                raise PlanError("a Triton kernel hash must be alphanumeric")
            k.metadata = _obj(d.get("metadata"), "kernel metadata")
            for key in ("name", "num_warps", "shared", "target"):
                if key not in k.metadata:
                    raise PlanError(f"Triton metadata lacks {key}")
            if k.metadata["name"] != k.name:
                raise PlanError("Triton metadata names another kernel")
            for key in ("global_scratch_size", "profile_scratch_size"):
                _int(k.metadata.get(key, 0), f"Triton metadata {key}", 0, MAX_SCRATCH)
            _int(k.metadata.get("num_ctas", 1), "Triton metadata num_ctas", 1, 16)
            if k.metadata.get("profile_scratch_size", 0):
                raise PlanError(f"kernel {k.name} was built with profiling instrumentation (profile scratch), "
                                "which kloop does not replay")
            k.blob = _blob_name(d.get("blob"))
            self._blob(k.blob, _int(d.get("blob_bytes"), "cubin size", 1, 1 << 30))
            k.ptx = _text(d.get("ptx", ""), "ptx")
            k.signature = {_ident(n, "argument name"): _sig(t) for n, t in _obj(d.get("signature"), "signature").items()}
            k.arg_names = [_ident(n, "argument name") for n in _list(d.get("arg_names"), "arg names", 512)]
            if list(k.signature) != k.arg_names:
                raise PlanError("a Triton kernel's signature and argument names disagree")
        elif kind == "interpreted":
            k.functions = {_ident(n, "function name"): _text(s, "function source")
                           for n, s in _obj(d.get("functions"), "functions").items()}
            if k.name not in k.functions:
                raise PlanError(f"kernel {k.name} has no source")
            k.constants = {_ident(n, "constant name"): _json_scalar(v, "constant")
                           for n, v in _obj(d.get("constants", {}), "constants").items()}
            k.aliases = {_ident(n, "alias"): _module_name(m) for n, m in _obj(d.get("aliases", {}), "aliases").items()}
            k.arg_names = [_ident(n, "argument name") for n in _list(d.get("arg_names"), "arg names", 512)]
        else:
            k.ptx = _text(d.get("ptx"), "ptx")
            if not k.ptx.strip() or not k.ptx.isascii():  # what ptxas takes: the trusted side assembles it
                raise PlanError(f"kernel {k.name}: PTX must be non-empty ASCII text")
        return k

    def ref(self, raw) -> Ref:
        pair = _list(raw, "buffer reference", 2)
        if len(pair) != 2 or pair[0] not in BUFFER_KINDS:
            raise PlanError("a buffer reference is [kind, index]")
        ref = Ref(pair[0], _int(pair[1], "buffer index", 0, MAX_BUFFERS))
        count = {"input": len(self.current.inputs), "alloc": len(self.current.allocs),
                 "state": len(self.current.state)}[ref.kind]
        if ref.index >= count or (ref.kind == "input" and self.current.inputs[ref.index].dtype is None):
            raise PlanError(f"reference to {ref.kind} {ref.index}, which the plan does not have")
        return ref

    def span(self, ref: Ref, offset: int, dtype: str, shape: list[int], stride: list[int], what: str) -> None:
        """A strided view must lie inside its buffer."""
        if len(shape) != len(stride):
            raise PlanError(f"{what}: shape and stride differ in length")
        if any(s < 0 for s in stride):
            raise PlanError(f"{what}: negative strides are not supported")
        size = ITEMSIZE[dtype]
        if offset % size:
            raise PlanError(f"{what}: offset {offset} is not a multiple of the {dtype} size")
        if 0 in shape:
            return
        last = sum((n - 1) * s for n, s in zip(shape, stride))
        if offset + (last + 1) * size > self.current.nbytes(ref):
            raise PlanError(f"{what} reaches past the end of its buffer")

    def pointer(self, raw) -> Pointer:
        d = _obj(raw, "pointer")
        if d.get("ref") is None:
            return Pointer(None)
        ref = self.ref(d["ref"])
        offset = _int(d.get("offset", 0), "pointer offset", 0, 1 << 42)
        if offset > self.current.nbytes(ref):
            raise PlanError("a pointer argument starts past the end of its buffer")
        return Pointer(ref, offset, _dtype(d.get("dtype", "uint8")))

    def arg(self, raw, depth: int = 0):
        d = _obj(raw, "argument")
        if len(d) != 1 or depth > 4:
            raise PlanError("an argument has exactly one kind")
        (kind, value), = d.items()
        if kind == "ptr":
            return self.pointer(value)
        if kind == "scalar":
            s = _obj(value, "scalar")
            t = s.get("type")
            if t in INT_TYPES:
                lo, hi = INT_TYPES[t]
                v = s.get("value")
                if isinstance(v, bool):
                    v = int(v)
                return Scalar(_int(v, "integer argument", lo, hi), t)
            if t in FLOAT_TYPES:
                v = s.get("value")
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise PlanError("a float argument is not a number")
                return Scalar(float(v), t)
            raise PlanError(f"unknown scalar type {t!r}")
        if kind == "constexpr":
            return Constexpr(_json_scalar(value, "constexpr"))
        if kind == "desc":  # an interpreted kernel's (a Triton kernel's are checked by triton_args)
            return self.descriptor(value, None)
        if kind == "tuple":
            return tuple(self.arg(x, depth + 1) for x in _list(value, "tuple argument", 64))
        raise PlanError(f"unknown argument kind {kind!r}")

    def descriptor(self, raw, sig: str | None, meta: dict | None = None) -> Descriptor:
        """A host-side tensor descriptor: every byte it lets the TMA unit (or the kernel) reach must lie inside its
        buffer, counted in the element size the kernel will use (its signature's, not the recorded base's), and it
        must be one the TMA unit accepts (16-byte aligned base and strides, contiguous last dimension)."""
        s = _obj(raw, "descriptor")
        base = self.pointer(s.get("base"))
        if base.ref is None:
            raise PlanError("a tensor descriptor has no base")
        shape, strides = _ints(s.get("shape"), "descriptor shape"), _ints(s.get("strides"), "descriptor strides")
        block = _ints(s.get("block_shape"), "descriptor block shape")
        padding = s.get("padding", "zero")
        if padding not in ("zero", "nan"):
            raise PlanError("descriptor padding is zero or nan")
        dtype = base.dtype
        if sig is not None:
            declared = tensordesc_type(sig)
            if declared is None:
                raise PlanError(f"a tensor descriptor is passed where the kernel takes {sig}")
            dtype, declared_block = declared
            if block != declared_block:
                raise PlanError(f"a tensor descriptor's block shape {block} is not the {declared_block} its kernel "
                                "was compiled for")
        itemsize = ITEMSIZE[dtype]
        if meta is not None and (meta.get("elem_size") != itemsize or meta.get("fp4_padded")):
            raise PlanError("the kernel's tensor descriptor metadata disagrees with its signature")
        rank = len(shape)
        if not 1 <= rank <= 5 or len(strides) != rank or len(block) != rank:
            raise PlanError("a tensor descriptor has 1 to 5 dimensions, with as many strides and block sizes")
        if any(n < 1 or n >= 1 << 32 for n in shape):
            raise PlanError("a tensor descriptor's sizes must be in [1, 2^32)")
        if strides[-1] != 1:
            raise PlanError("a tensor descriptor's last dimension must be contiguous (stride 1)")
        if any((st * itemsize) % 16 or st * itemsize >= 1 << 40 for st in strides[:-1]):
            raise PlanError("a tensor descriptor's strides must be multiples of 16 bytes (and below 2^40 bytes)")
        if any(b < 1 or b > 256 or b & (b - 1) for b in block):
            raise PlanError("a tensor descriptor's block sizes must be powers of two up to 256")
        if base.offset % 16:
            raise PlanError("a tensor descriptor's base must be 16-byte aligned")
        reach = base.offset + (sum((n - 1) * st for n, st in zip(shape, strides)) + 1) * itemsize
        if reach > self.current.nbytes(base.ref):
            raise PlanError(f"a tensor descriptor reaches {reach} bytes into {base.ref.kind} {base.ref.index}, "
                            f"which holds {self.current.nbytes(base.ref)}: its shape and strides go past the buffer")
        return Descriptor(Pointer(base.ref, base.offset, dtype), shape, strides, block, padding)

    def step(self, raw, outer: bool = False):
        d = _obj(raw, "step")
        op = d.get("op")
        self.steps_read += 1
        if self.steps_read > MAX_STEPS:
            raise PlanError(f"the plan has more than {MAX_STEPS} steps, its choose steps' options included")
        if op == "choose":
            if not outer:
                raise PlanError("a choose step's option holds another choose step")
            return self.choose(d)
        if op == "fill":
            ref = self.ref(d.get("ref"))
            if ref.kind == "input":
                raise PlanError("forward fills one of its inputs (inputs must be left unchanged)")
            fill = Fill(ref, _int(d.get("offset", 0), "fill offset", 0, 1 << 42), _dtype(d.get("dtype")),
                        _ints(d.get("shape"), "fill shape"), _ints(d.get("stride"), "fill stride"),
                        _json_scalar(d.get("value"), "fill value"))
            if not isinstance(fill.value, (int, float, bool)):
                raise PlanError("a fill value is a number")
            self.span(ref, fill.offset, fill.dtype, fill.shape, fill.stride, "a fill")
            return fill
        if op == "launch":
            kernel = _int(d.get("kernel"), "kernel index", 0, len(self.current.kernels) - 1)
            grid = _ints(d.get("grid"), "grid")
            if len(grid) != 3 or any(not 1 <= g <= m for g, m in zip(grid, MAX_GRID)):
                raise PlanError(f"grid {grid} is outside the GPU's limits")
            k = self.current.kernels[kernel]
            raw_args = _list(d.get("args"), "arguments", 512)
            if k.kind in ("triton", "interpreted") and len(raw_args) != len(k.arg_names):
                raise PlanError(f"kernel {k.name} takes {len(k.arg_names)} arguments, the launch passes "
                                f"{len(raw_args)}")
            launch = Launch(kernel, grid, self.triton_args(k, raw_args) if k.kind == "triton" else
                            [self.arg(a) for a in raw_args])
            if k.kind == "triton":
                launch.scratch = self.scratch(k, grid, d.get("scratch"))
            if k.kind == "ptx":
                launch.block = _ints(d.get("block"), "block")
                if len(launch.block) != 3 or min(launch.block) < 1 or \
                        launch.block[0] * launch.block[1] * launch.block[2] > 1024:
                    raise PlanError(f"block {launch.block} is outside the GPU's limits")
                launch.shared = _int(d.get("shared", 0), "dynamic shared memory", 0, 227 * 1024)
            return launch
        raise PlanError(f"unknown step {op!r}")

    def choose(self, d: dict) -> Choose:
        site = _int(d.get("site"), "choose site", 0, MAX_KERNELS - 1)
        options = [[self.step(x) for x in _list(option, "option", MAX_STEPS)]
                   for option in _list(d.get("options"), "options", MAX_OPTIONS)]
        if len(options) < 2 or not all(any(isinstance(x, Launch) for x in option) for option in options):
            raise PlanError("a choose step has two or more options, each launching a kernel")
        if self.site_options.setdefault(site, len(options)) != len(options):
            raise PlanError(f"choose steps of site {site} offer different numbers of options")
        return Choose(site, options)

    def triton_args(self, k: Kernel, raw_args: list) -> list:
        """A Triton launch's arguments, each checked against its type in the kernel's signature."""
        metas = k.metadata.get("tensordesc_meta") or None
        descs = [n for n in k.arg_names if k.signature[n].startswith("tensordesc")]
        if metas is not None and (not isinstance(metas, list) or len(metas) != len(descs)):
            raise PlanError(f"kernel {k.name}'s metadata describes {len(metas) if isinstance(metas, list) else 0} "
                            f"tensor descriptors, its signature has {len(descs)}")
        args = []
        for name, raw in zip(k.arg_names, raw_args):
            sig = k.signature[name]
            if sig.startswith("tensordesc"):
                if not isinstance(raw, dict) or list(raw) != ["desc"]:
                    raise PlanError(f"kernel {k.name} takes a tensor descriptor as {name}")
                meta = _obj(metas[descs.index(name)], "descriptor metadata") if metas else None
                args.append(self.descriptor(raw["desc"], sig, meta))
            else:
                args.append(self.arg(raw))
                if isinstance(args[-1], Descriptor):
                    raise PlanError(f"a tensor descriptor is passed as {name}, where kernel {k.name} takes {sig}")
        return args

    def scratch(self, k: Kernel, grid: list[int], raw) -> Ref | None:
        """The allocation serving as a Triton launch's global scratch: as big as the kernel's metadata asks for
        this grid (Triton's launcher: per-program size x programs x CTAs), computed here, not taken from the plan."""
        needed = k.metadata.get("global_scratch_size", 0) * k.metadata.get("num_ctas", 1) * math.prod(grid)
        if raw is None:
            if needed:
                raise PlanError(f"kernel {k.name} needs {needed} bytes of global scratch and the launch names none")
            return None
        ref = self.ref(raw)
        if ref.kind != "alloc":
            raise PlanError("a launch's global scratch must be an allocation of the plan")
        if self.current.allocs[ref.index] < needed:
            raise PlanError(f"kernel {k.name} needs {needed} bytes of global scratch, allocation {ref.index} holds "
                            f"{self.current.allocs[ref.index]}")
        return ref

    def output(self, raw) -> OutputSpec:
        d = _obj(raw, "output")
        ref = self.ref(d.get("ref"))
        if ref.kind != "alloc":
            raise PlanError("an output must be memory forward allocated (not an input, parameter or cached buffer)")
        out = OutputSpec(ref, _int(d.get("offset", 0), "output offset", 0, 1 << 42), _dtype(d.get("dtype")),
                         _ints(d.get("shape"), "output shape"), _ints(d.get("stride"), "output stride"))
        self.span(ref, out.offset, out.dtype, out.shape, out.stride, "an output")
        return out


def _obj(value, what: str) -> dict:
    if not isinstance(value, dict):
        raise PlanError(f"{what} is not an object")
    return value


def _list(value, what: str, limit: int) -> list:
    if not isinstance(value, list):
        raise PlanError(f"{what} is not a list")
    if len(value) > limit:
        raise PlanError(f"{what} has more than {limit} entries")
    return value


def _int(value, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PlanError(f"{what} must be an integer in [{lo}, {hi}]")
    return value


def _ints(value, what: str) -> list[int]:
    return [_int(v, what, 0, 1 << 42) for v in _list(value, what, 16)]


def _text(value, what: str, limit: int = 8 << 20) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise PlanError(f"{what} must be text of at most {limit} characters")
    return value


def _ident(value, what: str) -> str:
    if not isinstance(value, str) or not value.isidentifier() or len(value) > 256 or value.startswith("__"):
        raise PlanError(f"{what} must be a plain identifier")
    return value


def _module_name(value) -> str:
    if value not in ("triton", "triton.language", "triton.language.extra.libdevice"):
        raise PlanError(f"a kernel may not use module {value!r}")
    return value


def _dtype(value) -> str:
    if value not in DTYPES:
        raise PlanError(f"dtype {value!r} is not one kloop handles")
    return value


def _sig(value) -> str:
    if not isinstance(value, str) or len(value) > 128:
        raise PlanError("a signature type is a short string")
    if value == "constexpr" or value in INT_TYPES or value in FLOAT_TYPES or _POINTER_SIG.fullmatch(value) or \
            _TENSORDESC_SIG.fullmatch(value):
        return value
    raise PlanError(f"unknown signature type {value!r}")


def tensordesc_type(signature: str) -> tuple[str, list[int]] | None:
    """(element dtype, block shape) of a Triton `tensordesc<bf16[128, 64]>` signature type; None for other types."""
    match = _TENSORDESC_SIG.fullmatch(signature) if isinstance(signature, str) else None
    if match is None:
        return None
    return TRITON_DTYPES[match.group(1)], [int(d) for d in match.group(2).split(",")]


def _json_scalar(value, what: str):
    """JSON leaves and flat lists of them (constexpr tuples); never objects."""
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, str) and len(value) > 256:
            raise PlanError(f"{what} is too long")
        return value
    if isinstance(value, list) and len(value) <= 64 and not any(isinstance(v, (list, dict)) for v in value):
        return [_json_scalar(v, what) for v in value]
    raise PlanError(f"{what} must be a number, string, boolean, null or a short list")
