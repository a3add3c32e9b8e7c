"""A starter kernel for any target: the Triton code torch.compile (Inductor) generates for its reference, made
into one standalone candidate module.

The reference runs through Dynamo with every tensor (parameters, buffers, inputs) a plain graph input and dynamic
sizes (no duck sizing), so the generated kernels take their sizes as arguments and serve the hidden shape variants
too; a parameter's or buffer's size that no checked shape changes (a network's channel counts) stays a constant
(fixed_sizes), and the candidate refuses a Model built with another. Where PyTorch would fix a size as a constant,
or Inductor would call ATen, the trace computes the same thing another way (`_traceable_ops`: layer_norm,
InstanceNorm, max_pool1d, a large avg_pool3d window, attention), and every convolution is one opaque op that kloop's
own Triton kernel computes (agent/kernels/inductor_conv.py; Inductor's conv template fixes channels and kernel size,
cuDNN is a library call). Sizes that other modules fix at construction stay constants (Dynamo specializes them).
The candidate holds:
- Inductor's `@triton.jit` kernels, verbatim except that `triton_helpers.f` calls become copies of those helper
  functions (`_th_f`, themselves `@triton.jit`) and `tl_math` is `tl.math`; libdevice comes from
  `triton.language.extra` (no import of Inductor's runtime);
- per kernel, UPPERCASE tunables (`K0_XBLOCK`, `K0_R0_BLOCK`, `K0_NUM_WARPS`, `K0_NUM_STAGES`) for the offline
  policy's search, their defaults the first configuration Inductor's own heuristics give that kernel (on a GPU,
  the fastest of those configurations, timed at generation as torch.compile's autotuner does:
  agent/kernels/starter_tune.py), and a launcher that computes the grid as Inductor's grid types do (Grid1D,
  Grid2D, Grid3D, Grid2DWithYZOverflow; a template's FixedGrid comes from the wrapper, so a GEMM template tunes
  warps and stages, not its tiles, and over fp32 operands `K<i>_TF32X3`: its product on the tensor cores as 3xTF32
  rather than on the FMA units, see tf32x3_switch);
- where the reference convolves, kloop's convolution kernel and launcher (`_conv`), tuned by `CONV_*` constants;
- Inductor's wrapper (`call(args)`) translated: allocations become `torch.empty_strided` on the inputs' device,
  `reinterpret_tensor` an `as_strided` view, each `kernel.run(...)` a launcher call; device guards and stream
  look-ups are dropped;
- the reference's own source (minus get_inputs/get_init_inputs and KLOOP_* settings), so that `ModelNew(Model)`
  builds the same parameters; its `forward` passes them with the inputs to the translated wrapper;
- a second set of kernels and wrapper (`*_main`, `_inductor_call_main`), traced with the main shape's static sizes
  as torch.compile compiles a first call, which `forward` runs on exactly that layout (`_MAIN_LAYOUT`): a symbolic
  size keeps Inductor from choices it makes for a known one (online softmax needs a row proven long enough). These
  kernels' tunables are the searched ones; the dynamic kernels serve every other shape at Inductor's first
  configuration.

Matmuls become Triton through Inductor's templates: generation runs with max-autotune for GEMMs restricted to
the TRITON backend (on a GPU this benchmarks the template configurations, as torch.compile's max-autotune does);
where Inductor still calls cuBLAS (extern mm, addmm, bmm, baddbmm) or cuDNN, the call becomes kloop's own Triton
GEMM (agent/kernels/inductor_gemm.py) or convolution (OWN_LAUNCHERS). Recurrent layers (nn.LSTM, nn.GRU, nn.RNN), of
which Dynamo makes no graph, are traced as one op each and computed by kloop's Triton recurrence
(agent/kernels/inductor_rnn.py). A reference that Dynamo splits into several graphs gets each graph's kernels, glued
into one wrapper in the order its forward ran them (glue_graphs). Where Inductor calls another library or an aten
fallback, a value between graphs is PyTorch's own, or Inductor makes a kernel kind the translation does not launch,
there is no standalone starter: `NoStarter` says why in one line, led by its class (FAILURE_CLASSES).

On a CUDA machine this is Inductor's CUDA Triton codegen. Without a GPU, Inductor's Triton backend for CPU
(`cpu_backend = "triton"`) generates the same kind of kernels, which kloop runs under TRITON_INTERPRET=1; only the
source is generated (no Triton compile, so no CPU Triton driver is needed).

The generation runs in a child process (`python -m agent.kernels.inductor TARGET [--small]`), so Dynamo's and
Inductor's global state and a crash or hang there never touch the loop: `generate()` is the entry point.
"""
from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import json
import linecache
import os
import re
import subprocess
import sys
import textwrap
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
HELPER_PREFIX = "_th_"
MAX_Y_GRID = 65535                # CUDA's limit on grid y and z; Inductor folds larger y grids into z

# Tunable values per kernel kind (Inductor's own default is added to its list where it is missing).
POINTWISE_XBLOCK = [128, 256, 512, 1024, 2048, 4096]
TILE_BLOCK = [8, 16, 32, 64, 128]
PERSISTENT_XBLOCK = [1, 2, 4, 8, 16, 32, 64]
LOOPED_XBLOCK = [1, 2, 4, 8, 16, 32, 64]
LOOPED_R0_BLOCK = [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
NUM_WARPS = [1, 2, 4, 8, 16]
NUM_STAGES = [1, 2, 3, 4, 5]
# A static trace's matmul whose K dwarfs its output (K >= LONG_K_RATIO * max(M, N)) leaves Inductor no Triton GEMM
# template, and one tile per 64x64 of output would leave most SMs idle: it becomes split-K (rewrite_long_matmuls).
LONG_K_RATIO = 32
SPLIT_K_PROGRAMS = 512   # the split count aims at this many 64x64 output tiles times splits
MAX_SPLIT_K = 64
MAX_TILE_ELEMENTS = 8192   # a persistent reduction keeps XBLOCK * R0_BLOCK values live: XBLOCK shrinks to fit
# Under the CPU interpreter every program, and every loop step, is Python over numpy blocks, and a reduction with a
# combine function (Inductor's NaN-propagating max) calls it per element: Inductor's defaults for tiny sizes
# (XBLOCK 2, R0_BLOCK 16) take minutes there, and so do tiles padded far past the data. So under the interpreter
# (nothing is timed) one tile spans a whole row where it can, no wider than the sizes Inductor generated for, and
# Inductor's max2/min2 helpers become tl.max/tl.min (numpy's max and min propagate NaN there, as the helpers do).
INTERPRETER_TILE = 8192
# Likewise Inductor's welford helper (a tl.reduce with a combine function): an InstanceNorm at CPU size took 208 s
# there. Under the interpreter the lanes are combined in closed form instead: the same count, mean and M2 (sum of
# squared deviations) up to rounding.
INTERPRETER_WELFORD = '''@triton.jit
def _th_welford(mean, m2, weight, dim):
    count = tl.sum(weight, dim)
    total = tl.sum(mean * weight, dim) / tl.where(count == 0, 1.0, count)
    delta = mean - tl.expand_dims(total, dim)
    return total, tl.sum(m2 + weight * delta * delta, dim), count
'''


# Why a target has no starter, by class: the first pattern its reason matches (checked in order).
FAILURE_CLASSES = (
    ("timeout", r"did not finish generating"),
    ("generator_crash", r"^generating Inductor's Triton failed"),
    ("reference_fails", r"^the reference (fails|returns)"),
    ("graph_break", r"splits the reference into \d+ graphs"),
    ("graph_input", r"graph input the generator cannot rebuild"),
    ("library_call", r"a library call"),
    ("pytorch_fallback", r"a PyTorch fallback"),
    ("no_template", r"no Triton template"),
    ("recurrent", r"recurrent layer"),
    ("kernel_kind", r"kernel|launch grid|constexpr|triton_helpers|allocates with|launches"),
    ("compile_error", r"^torch\.compile could not generate"),
    ("rule", r"^the generated candidate"),
    ("no_kernel", r"generated no Triton kernel"),
)


def failure_class(reason: str) -> str:
    """The short class name of a NoStarter reason (FAILURE_CLASSES; `other` where none matches)."""
    return next((name for name, pattern in FAILURE_CLASSES if re.search(pattern, reason)), "other")


class NoStarter(Exception):
    """No standalone starter for this target; the message is one line that says why, led by its class
    (`graph_break: torch.compile splits ...`), as the suite report lists it. A reason that already leads with a
    class (a child's reply) keeps it."""

    def __init__(self, reason: str, kind: str | None = None):
        led = re.match(r"(\w+): (.*)$", reason, re.S)
        if kind is None and led and led.group(1) in dict(FAILURE_CLASSES) | {"other": ""}:
            kind, reason = led.groups()
        self.reason = reason
        self.kind = kind or failure_class(reason)
        super().__init__(f"{self.kind}: {reason}")


class GenerationStopped(NoStarter):
    """The generating child was killed (a stop, the kernel's OOM killer): nothing is known about the
    target, so it is generated again later rather than recorded as having no starter."""

    def __init__(self, reason: str):
        super().__init__(reason, kind="stopped")


@dataclass
class Generated:
    """A standalone starter: its source with tunables at the top, their value lists and defaults."""
    source: str
    tunables: dict[str, list]
    defaults: dict
    notes: str
    kernels: list[str] = field(default_factory=list)
    # per group of tunables (each kernel, then the convolution), the settings worth timing on a GPU, the defaults
    # first: Inductor's configurations in its order (agent/kernels/starter_tune.py)
    choices: list[list[dict]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Generated":
        return cls(d["source"], d["tunables"], d["defaults"], d["notes"], list(d.get("kernels") or []),
                   list(d.get("choices") or []))

    def with_defaults(self, values: dict, note: str) -> "Generated":
        """This starter with other default values (its `NAME = value` lines; a value missing from its tunable's
        list joins it), the note appended."""
        from agent.kernels.constants import replace_constants

        tunables = {name: _with_default(list(options), values[name]) if name in values else options
                    for name, options in self.tunables.items()}
        notes = self.notes + (f"; defaults timed at generation: {note}" if note else "")
        return Generated(replace_constants(self.source, values), tunables, {**self.defaults, **values}, notes,
                         list(self.kernels), self.choices)


# -- the parent side ----------------------------------------------------------------------------------------------
_RUNNING: set = set()   # generating children, so that a stopped suite can end them (stop_generating)


def stop_generating() -> None:
    """Kill every generation in flight in this process (their callers get NoStarter)."""
    for child in list(_RUNNING):
        child.kill()


def generate(target_spec: str, small: bool | None = None, timeout_s: float = TIMEOUT_S,
             visible: str | None = None) -> Generated:
    """The standalone Inductor starter for a target (a built-in name or a KernelBench-style file), generated in a
    child process. small: generate at the target's CPU size (default: when there is no CUDA GPU); visible: the
    CUDA_VISIBLE_DEVICES entry of the GPU to generate on (None: this process's). NoStarter, with a one-line reason,
    when there is none; GenerationStopped when the child was killed (stop_generating, the OOM killer)."""
    if small is None:
        from tools.inputs import DEVICE
        small = DEVICE.type != "cuda"
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1" if small else "0")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    # Inductor compiles template candidates with a pool of one worker per core; a suite runs several generations
    # side by side, each with a small pool
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "2")
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    command = [sys.executable, "-m", "agent.kernels.inductor", str(target_spec)] + (["--small"] if small else [])
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=str(ROOT)) as child:
        _RUNNING.add(child)
        try:
            try:
                stdout, stderr = child.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.kill()
                child.communicate()
                raise NoStarter(f"torch.compile did not finish generating Triton within {timeout_s:.0f} s") from None
        finally:
            _RUNNING.discard(child)
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = " ".join((stderr or "").strip().splitlines()[-1:])[:300]
        failure = f"generating Inductor's Triton failed (exit {child.returncode}): {tail or 'no output'}"
        raise GenerationStopped(failure) if child.returncode < 0 else NoStarter(failure)
    reply = json.loads(lines[-1])
    if "error" in reply:
        raise NoStarter(reply["error"])
    return Generated.from_dict(reply)


# -- the child side -----------------------------------------------------------------------------------------------
def _configure(cuda: bool) -> None:
    """Inductor settings for generation: no caches or freezing (parameters stay graph inputs); GEMMs and
    convolutions as Triton templates (max-autotune, TRITON backend) rather than cuBLAS/cuDNN calls; on the CPU,
    Inductor's Triton backend, and its first template configuration rather than benchmarking them all (each would
    run under the interpreter: minutes for one convolution)."""
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = False
    inductor_config.freezing = False
    inductor_config.max_autotune = True
    inductor_config.max_autotune_gemm = True
    inductor_config.max_autotune_gemm_backends = "TRITON"
    inductor_config.max_autotune_conv_backends = "TRITON"
    inductor_config.cpu_backend = "triton"
    if not cuda and hasattr(inductor_config, "deterministic"):
        inductor_config.deterministic = True
    if not cuda:  # timing a template with its epilogue fused: Inductor's CPU benchmark module does not import
        inductor_config.benchmark_epilogue_fusion = False


def capture(model, inputs: list, dynamic: bool = True, fixed: tuple = (), module_ints: bool = False
            ) -> tuple[str, list[str]]:
    """Inductor's wrapper module source for `model(*inputs)`, and the Dynamo source of each graph input
    (`L['args'][i]`, `L['args'][i].size()[d]`): the translated wrapper's `args`, in order. dynamic: sizes as
    arguments (the kernels serve every shape); else those of `inputs`, as torch.compile compiles a first call.
    fixed: with dynamic, the (parameter or buffer index, dim, size) that stay constants (fixed_sizes). module_ints
    (only with dynamic): the int attributes the forward reads from Model's modules are graph inputs too
    (`L['module']._modules['attn'].n_head`), not constants (varying_ints).

    Inductor's memory-coalescing analysis (a tiling heuristic) asserts on some symbolic shapes: torch 2.11 on a GPU,
    a reduction over the channels of kloop::convolution's output (KernelBench level 2's 25, 36, 58 and 92). Such a
    reference is captured again without the analysis, tiled as Inductor tiled before it."""
    import torch._inductor.config as inductor_config

    try:
        return _capture(model, inputs, dynamic, fixed, module_ints)
    except Exception as e:  # noqa: BLE001
        if not _failed_in_tiling_analysis(e):
            raise
    with inductor_config.patch({"triton.coalesce_tiling_analysis": False}):
        return _capture(model, inputs, dynamic, fixed, module_ints)


def _failed_in_tiling_analysis(error: BaseException) -> bool:
    import traceback

    while error is not None:
        if isinstance(error, AssertionError) or "AssertionError" in str(error):
            if any(frame.filename.endswith("tiling_utils.py") for frame in traceback.extract_tb(error.__traceback__)):
                return True
        error = error.__cause__ or error.__context__
    return False


def fixed_sizes(own: list[tuple[int, ...]], checked: list[list[tuple[int, ...]]] | None
                ) -> tuple[tuple[int, int, int], ...]:
    """(index among Model's parameters then buffers, dim, size) of each such size of the generated Model (`own`) that
    is the same at every checked shape, full and CPU size (Target.state_shapes: a starter made on a GPU is also checked
    on the CPU): the Model's construction fixes it, so the capture keeps it a constant. A shape whose Model has other
    tensors (ResNet101's CPU size has fewer layers) is one no starter of this Model serves, so it fixes nothing. A
    whole network with every weight size symbolic spent its generation in Inductor's code generation and sympy
    (ResNet18 at CPU size: over 600 s, 30 s with these fixed). None fixed where the Model cannot be built on meta."""
    if checked is None:
        return ()
    ranks = [len(shape) for shape in own]
    alike = [shapes for shapes in checked if [len(shape) for shape in shapes] == ranks]
    return tuple((i, d, size) for i, shape in enumerate(own) for d, size in enumerate(shape)
                 if all(shapes[i][d] == size for shapes in alike))


def varying_ints(checked: list[dict[str, int]] | None) -> list[str]:
    """The int attributes of Model's modules (Target.module_ints) that differ between the checked shapes: a hidden
    variant built with another `n_head` or `feature_size`. Dynamo makes a module's int a constant of the graph, so a
    starter captured with them fixed computes the variant with the main shape's (level 3's NetVLAD viewed its
    features by the main width, out of bounds; MinGPT's heads came out of negative size)."""
    if not checked:
        return []
    return sorted(name for name in set().union(*checked)  # among the shapes whose Model has it (ResNet101's layers)
                  if len({ints[name] for ints in checked if name in ints}) > 1)


def _capture(model, inputs: list, dynamic: bool, fixed: tuple = (), module_ints: bool = False
             ) -> tuple[str, list[str]]:
    import torch
    import torch._dynamo
    import torch.fx.experimental._config as fx_config
    import torch.utils._triton as torch_triton
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.graph import GraphLowering
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from agent.kernels import inductor_conv, inductor_rnn  # register kloop::convolution, kloop::recurrent

    if (reason := inductor_rnn.unsupported(model)) is not None:
        raise NoStarter(reason)
    _configure(any(getattr(t, "is_cuda", False) for t in inputs) or torch.cuda.is_available())
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    weights = [p.detach() for p in model.parameters()] + [b.detach() for b in model.buffers()]
    codes: list[str] = []
    graphs: list[list[str]] = []
    calls: list[tuple[int, tuple, object]] = []   # (graph, its inputs, its outputs) in the order the forward ran

    def codegen_only(self):  # the wrapper's source; the graph itself is not compiled (no Triton driver needed)
        wrapper, _kernels = self.codegen_with_cpp_wrapper() if self.cpp_wrapper else self.codegen()
        codes.append(wrapper.value)

        class NotRunnable:
            def call(self, args):
                raise RuntimeError("generated for its source only")
        return NotRunnable()

    def backend(gm, example_inputs):
        sources = []
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                arg = node.meta.get("grapharg")
                sources.append(arg.source.name if arg is not None else "?")
        graphs.append(sources)
        if not dynamic:
            rewrite_long_matmuls(gm)
        with mock.patch.object(torch_triton, "triton_hash_with_backend", lambda: "0" * 64), \
                mock.patch.object(GraphLowering, "compile_to_module", codegen_only):
            compile_fx(gm, example_inputs)
        graph = len(graphs) - 1

        def run(*args):  # the graph as the forward calls it: its inputs and outputs, to glue graphs by
            outs = gm.forward(*args)
            calls.append((graph, args, outs))
            return outs
        return run

    def flat(*args):
        return torch.func.functional_call(model, dict(zip(names, args[:len(names)])), tuple(args[len(names):]))

    def flat_module(module, *args):  # the Model an argument, so that Dynamo can make its ints graph inputs
        return torch.func.functional_call(module, dict(zip(names, args[:len(names)])), tuple(args[len(names):]))

    torch._dynamo.reset()
    for i, dim, _size in fixed if dynamic else ():
        torch._dynamo.mark_static(weights[i], dim)
    breaks = torch._dynamo.utils.counters["graph_break"]
    breaks.clear()
    torch._dynamo.config.specialize_float = True  # a float hyper-parameter is a constant of the kernel
    torch._dynamo.config.allow_rnn = True  # else Dynamo breaks the graph at a recurrent module (kloop::recurrent here)
    with torch.no_grad(), fx_config.patch(use_duck_shape=False), inductor_conv.traced_as_one_op(), \
            inductor_rnn.traced_as_one_op(), _traceable_ops(), sdpa_kernel([SDPBackend.MATH]), \
            torch._dynamo.config.patch(allow_unspec_int_on_nn_module=module_ints):
        run, args = (flat_module, (model, *weights, *inputs)) if module_ints else (flat, (*weights, *inputs))
        result = torch.compile(run, backend=backend, dynamic=dynamic, fullgraph=False)(*args)
    data_dependent = [reason for reason in breaks if _DATA_DEPENDENT.search(reason)]
    if data_dependent:  # a value read from a tensor's data would be a constant of the next graph
        raise NoStarter(f"torch.compile splits the reference into {len(graphs)} graphs where it reads a tensor's data "
                        f"({' '.join(data_dependent[0].split())[:120]}), which no plan can replay")
    if len(graphs) == 1 and len(codes) == 1 and all(_SOURCE.match(s) or _MODULE_SOURCE.match(s) for s in graphs[0]):
        return codes[0], graphs[0]
    # several graphs; or one whose inputs Dynamo names by another frame's locals (L['x'], L['self']._modules...: a
    # graph break before the first op, the forward resumed as a frame of its own; level 3's 31 and 32 on torch 2.11):
    # each input found by identity among the weights, the inputs and earlier graphs' outputs
    if graphs and len(codes) == len(graphs):
        return glue_graphs(codes, graphs, calls, weights + list(inputs), result)
    raise NoStarter(f"torch.compile splits the reference into {len(graphs)} graphs (graph breaks); a standalone "
                    "starter needs one")


# Dynamo's reasons for a graph break where the forward reads a tensor's data on the host
_DATA_DEPENDENT = re.compile(r"item\(\)|tolist|[Dd]ata.dependent|numpy|jump", re.I)
_SIZE_SOURCE = re.compile(r"^(?P<base>.+)\.(?:size\(\)\[(?P<size>\d+)\]|stride\(\)\[(?P<stride>\d+)\]|"
                          r"(?P<offset>storage_offset)\(\))$")


def glue_graphs(codes: list[str], graphs: list[list[str]], calls: list, flat: list, result) -> tuple[str, list[str]]:
    """One wrapper, as Inductor would write it, for a reference that torch.compile splits into several graphs (or one
    whose inputs another frame's locals name), and its graph inputs (the whole of `flat`): each graph's kernels
    (renamed `<kernel>_g<graph>`), and a `call` that runs the graphs' own calls in the order the forward ran them,
    each taking what the forward passed it: a tensor of
    `flat` or an earlier graph's output (known by identity from the reference's run), a size or stride of one of
    its tensors. NoStarter where the forward passes a graph anything else (a tensor PyTorch computed between the
    graphs, a Python int of its own): nothing a plan could replay."""
    import torch

    known = {id(v): f"args[{i}]" for i, v in enumerate(flat) if isinstance(v, torch.Tensor)}
    definitions, body = [], []
    renamed = [_kernels_renamed(code, f"_g{graph}") for graph, code in enumerate(codes)]
    for graph, code in enumerate(renamed):
        definitions += [ast.unparse(node) for node in ast.parse(code).body if _is_kernel_definition(node)]
    for n, (graph, args, outs) in enumerate(calls):
        sources = graphs[graph]
        expressions = {}
        for j, (source, value) in enumerate(zip(sources, args)):
            if isinstance(value, torch.Tensor):
                if id(value) not in known:
                    raise NoStarter(f"torch.compile splits the reference into {len(graphs)} graphs (graph breaks), "
                                    f"and graph {graph} takes a tensor ({source}) that PyTorch computes between them")
                expressions[j] = known[id(value)]
        for j, (source, value) in enumerate(zip(sources, args)):
            if j in expressions:
                continue
            m = _SIZE_SOURCE.match(source)
            base = next((expressions[i] for i, s in enumerate(sources) if m and s == m["base"] and i in expressions),
                        None)
            if base is None:
                raise NoStarter(f"torch.compile splits the reference into {len(graphs)} graphs (graph breaks), and "
                                f"graph {graph} takes {source} ({type(value).__name__}), which no graph or input "
                                "gives")
            expressions[j] = (f"{base}.shape[{m['size']}]" if m["size"] else
                              f"{base}.stride({m['stride']})" if m["stride"] else f"{base}.storage_offset()")
        body += [f"args_c{n} = [{', '.join(expressions[j] for j in range(len(sources)))}]",
                 *_inlined_call(renamed[graph], f"_c{n}", f"out{n}")]
        for k, out in enumerate(outs if isinstance(outs, (tuple, list)) else [outs]):
            if isinstance(out, torch.Tensor):
                known.setdefault(id(out), f"out{n}[{k}]")
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    missing = [i for i, r in enumerate(results) if not isinstance(r, torch.Tensor) or id(r) not in known]
    if missing:
        raise NoStarter(f"torch.compile splits the reference into {len(graphs)} graphs (graph breaks), and output "
                        f"{missing[0]} is computed by PyTorch between them")
    lines = "\n    ".join(body + [f"return ({''.join(known[id(r)] + ', ' for r in results)})"])
    wrapper = "\n".join(definitions) + f"\n\n\ndef call(args):\n    {lines}\n"
    return wrapper, [f"L['args'][{i}]" for i in range(len(flat))]


def _is_kernel_definition(node) -> bool:
    return isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
        ast.unparse(node.value.func) == "async_compile.triton"


def _kernels_renamed(wrapper: str, suffix: str) -> str:
    """Inductor's wrapper with each of its Triton kernels named `<name><suffix>`."""
    for name in _kernel_texts(wrapper):
        wrapper = re.sub(rf"\b{re.escape(name)}\b", f"{name}{suffix}", wrapper)
    return wrapper


def _inlined_call(wrapper: str, suffix: str, result: str) -> list[str]:
    """The statements of Inductor's `call(args)` with each of its local names suffixed (its argument list is
    `args<suffix>`), `args.clear()` dropped, and its return an assignment to `result`."""
    call = next(node for node in ast.walk(ast.parse(wrapper)) if isinstance(node, ast.FunctionDef) and
                node.name == "call")
    local = {a.arg for a in call.args.args} | {n.id for n in ast.walk(call) if isinstance(n, ast.Name) and
                                               isinstance(n.ctx, ast.Store)}

    class Renamer(ast.NodeTransformer):
        def visit_Name(self, node):
            if node.id in local:
                node.id += suffix
            return node

    statements = []
    for stmt in call.body:
        if isinstance(stmt, ast.Expr) and ast.unparse(stmt.value) == "args.clear()":
            continue
        if isinstance(stmt, ast.Return):
            stmt = ast.Assign([ast.Name(result, ast.Store())], stmt.value or ast.Constant(None))
        elif any(isinstance(n, ast.Return) for n in ast.walk(stmt)):
            raise NoStarter("Inductor's wrapper returns from inside a block, which the generator cannot glue")
        statements.append(ast.unparse(ast.fix_missing_locations(Renamer().visit(stmt))))
    return [line for stmt in statements for line in stmt.split("\n")]


_MATMULS = {"matmul", "mm", "__matmul__"}


def rewrite_long_matmuls(gm) -> int:
    """In a graph of static sizes, each 2-D floating matmul [M, K] x [K, N] that one GEMM would run on a few programs
    is computed another way that gives the same product (up to the order of the sums), as Inductor's own decompose_k
    does (which kloop's codegen-only capture cannot benchmark):
    - a matrix-vector product (N or M is 1) is a product and a sum over K: a memory-bound reduction;
    - for K >= LONG_K_RATIO * max(M, N) in fp32 or fp64, K is split in S parts, multiplied as one batched GEMM
      [S, M, K/S] x [S, K/S, N], and the S partial products summed.
    Returns how many were rewritten."""
    import operator

    import torch

    rewritten = 0
    for node in list(gm.graph.nodes):
        is_matmul = node.op == "call_function" and node.target in (torch.matmul, torch.mm, operator.matmul) or \
            node.op == "call_method" and node.target in _MATMULS
        if not is_matmul or len(node.args) != 2 or node.kwargs:
            continue
        a, b = node.args
        va, vb = (getattr(x, "meta", {}).get("example_value") for x in (a, b))
        if not all(isinstance(v, torch.Tensor) and v.dim() == 2 and v.dtype.is_floating_point for v in (va, vb)) or \
                va.dtype != vb.dtype or not all(isinstance(d, int) for d in (*va.shape, *vb.shape)):
            continue
        (m, k), n = va.shape, vb.shape[1]
        splits = _split_count(m, n, k)
        # half-precision partial products would each be rounded to 16 bits before the sum: those keep one GEMM
        if min(m, n) != 1 and (splits < 2 or va.dtype not in (torch.float32, torch.float64)):
            continue

        def emit(fn, *args, **kwargs):
            new = gm.graph.call_function(fn, args, kwargs)
            values = [x.meta["example_value"] if isinstance(x, torch.fx.Node) else x for x in args]
            with getattr(va, "fake_mode", None) or contextlib.nullcontext():
                new.meta["example_value"] = fn(*values, **kwargs)
            return new

        with gm.graph.inserting_before(node):
            if n == 1:
                product = emit(torch.sum, emit(operator.mul, a, emit(torch.reshape, b, (1, k))), 1, keepdim=True)
            elif m == 1:
                product = emit(torch.sum, emit(operator.mul, emit(torch.reshape, a, (k, 1)), b), 0, keepdim=True)
            else:
                parts = emit(torch.transpose, emit(torch.reshape, a, (m, splits, k // splits)), 0, 1)
                product = emit(torch.sum, emit(torch.bmm, parts, emit(torch.reshape, b, (splits, k // splits, n))), 0)
        node.replace_all_uses_with(product)
        gm.graph.erase_node(node)
        rewritten += 1
    if rewritten:
        gm.recompile()
    return rewritten


def _split_count(m: int, n: int, k: int) -> int:
    """How many parts a long K is split into (1: not split): enough that the 64x64 output tiles times the parts reach
    SPLIT_K_PROGRAMS, at most MAX_SPLIT_K, a power of two that divides K."""
    if k < LONG_K_RATIO * max(m, n):
        return 1
    tiles = -(-m // 64) * -(-n // 64)
    splits = 1
    while splits < MAX_SPLIT_K and tiles * splits < SPLIT_K_PROGRAMS and k % (2 * splits) == 0:
        splits *= 2
    return splits


@contextlib.contextmanager
def _traceable_ops():
    """While tracing, ops that would keep a size of the main shape as a constant, or make Inductor call ATen, are
    computed another way that gives the same result wherever the original runs:
    - layer_norm reads its normalized shape (a module constant) from the input's trailing sizes, which must equal it;
    - max_pool1d is max_pool2d over a height of 1 (ATen's C++ max_pool1d reads the length as an int);
    - an avg_pool3d window of more than 25 elements with stride unlike the window, which Inductor leaves to ATen, is
      a pool over height and width, then one over depth: with padding counted, the window's sum and divisor
      separate;
    - scaled_dot_product_attention without mask, dropout or causality, which Inductor makes an ATen attention
      kernel, is its definition: softmax(Q K^T / sqrt(E)) V, two matmuls (Inductor's GEMM templates) and a softmax.
    - an InstanceNorm module does not compare its input's channels with num_features (the comparison fixed the
      channel count; the reference's run already made it, and F.instance_norm does not read num_features);
    - multi-head attention (nn.MultiheadAttention) without masks, dropout, extra key/value biases or separate
      projections is its definition too: the packed projection, softmax(Q K^T / sqrt(head size)) V per head as
      batched matmuls, the output projection, and the weights averaged over heads where asked for. Its own code
      checks the input's width against the module's embed_dim and scales by a Python float of the head size,
      both of which fixed the width of the main shape. Otherwise it runs as written, the width checked against
      itself.
    And warnings.warn does nothing: Dynamo breaks the graph at one, and the reference's own run has already shown it."""
    import torch
    from torch.nn import functional
    from torch.nn.modules.instancenorm import _InstanceNorm

    layer_norm, avg_pool3d = functional.layer_norm, functional.avg_pool3d
    multi_head_attention = functional.multi_head_attention_forward
    attention = functional.scaled_dot_product_attention

    def layer_norm_sized(input, normalized_shape, weight=None, bias=None, eps=1e-5):
        count = 1 if isinstance(normalized_shape, int) else len(normalized_shape)
        return layer_norm(input, input.shape[input.dim() - count:], weight, bias, eps)

    def first(v, default):
        v = list(v) if isinstance(v, (tuple, list)) else [v]
        return v[0] if v else default

    def max_pool1d_sized(input, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        size = first(kernel_size, None)
        return functional.max_pool2d(input.unsqueeze(-2), (1, size), (1, first(stride, size)), (0, first(padding, 0)),
                                     (1, first(dilation, 1)), ceil_mode).squeeze(-2)

    def avg_pool3d_separated(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                             divisor_override=None):
        three = lambda v: list(v) * (3 // len(v)) if isinstance(v, (tuple, list)) else [v] * 3  # noqa: E731
        k, p = three(kernel_size), three(padding)
        s = three(stride) if stride not in (None, (), []) else k
        if ceil_mode or not count_include_pad or divisor_override or k[0] * k[1] * k[2] <= 25 or \
                k[1] * k[2] > 25 or k[0] > 25:
            return avg_pool3d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
        planes = avg_pool3d(input, [1, k[1], k[2]], [1, s[1], s[2]], [0, p[1], p[2]])
        return avg_pool3d(planes, [k[0], 1, 1], [s[0], 1, 1], [p[0], 0, 0])

    def attention_as_matmuls(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                             enable_gqa=False):
        if attn_mask is not None or dropout_p or is_causal or enable_gqa:
            return attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        if scale is None:  # 1/sqrt(E) as a tensor, so that the head size stays a symbol
            scale = query.new_full((), query.shape[-1]).rsqrt()
        scores = torch.matmul(query, key.transpose(-2, -1)) * scale
        return torch.matmul(torch.softmax(scores, dim=-1), value)

    def instance_norm_unchecked(self, input):
        self._check_input_dim(input)
        if input.dim() == self._get_no_batch_dim():
            return self._handle_no_batch_input(input)
        return self._apply_instance_norm(input)

    with mock.patch.object(warnings, "warn", lambda *args, **kwargs: None), \
            mock.patch.object(_InstanceNorm, "forward", instance_norm_unchecked), \
            mock.patch.object(functional, "layer_norm", layer_norm_sized), \
            mock.patch.object(torch, "max_pool1d", max_pool1d_sized), \
            mock.patch.object(functional, "avg_pool3d", avg_pool3d_separated), \
            mock.patch.object(functional, "multi_head_attention_forward",
                              _multi_head_attention_as_matmuls(multi_head_attention)), \
            mock.patch.object(functional, "scaled_dot_product_attention", attention_as_matmuls):
        yield


def _multi_head_attention_as_matmuls(original):
    """F.multi_head_attention_forward as _traceable_ops traces it (see there); `original` where a mask, dropout,
    extra biases or separate projections are asked for."""
    import torch
    from torch.nn import functional

    # its parameters and defaults, read here: inspect inside the traced forward would break Dynamo's graph
    attention_parameters = inspect.signature(original).parameters
    attention_defaults = {name: p.default for name, p in attention_parameters.items() if p.default is not p.empty}

    def as_matmuls(*args, **kwargs):
        a = {**attention_defaults, **dict(zip(attention_parameters, args)), **kwargs}
        a["embed_dim_to_check"] = a["query"].shape[-1]
        q, k, v = a["query"], a["key"], a["value"]
        if q.dim() != 3 or a["bias_k"] is not None or a["bias_v"] is not None or a["add_zero_attn"] or \
                (a["training"] and a["dropout_p"]) or a["key_padding_mask"] is not None or \
                a["attn_mask"] is not None or a["is_causal"] or a["use_separate_proj_weight"] or \
                a["static_k"] is not None or a["static_v"] is not None:
            return original(**a)
        (length, batch, width), source, heads = q.shape, k.shape[0], a["num_heads"]
        size = width // heads
        q, k, v = functional._in_projection_packed(q, k, v, a["in_proj_weight"], a["in_proj_bias"])
        q, k, v = (t.reshape(n, batch * heads, size).transpose(0, 1)
                   for t, n in ((q, length), (k, source), (v, source)))
        weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)) * q.new_full((), size).rsqrt(), dim=-1)
        out = torch.bmm(weights, v).transpose(0, 1).reshape(length * batch, width)
        out = functional.linear(out, a["out_proj_weight"], a["out_proj_bias"]).view(length, batch, width)
        if not a["need_weights"]:
            return out, None
        weights = weights.view(batch, heads, length, source)
        return out, weights.mean(dim=1) if a["average_attn_weights"] else weights

    return as_matmuls


@dataclass
class Kernel:
    name: str
    source: str            # from @triton.jit on
    kind: str              # pointwise, persistent_reduction, reduction, template
    grid: str              # Grid1D, Grid2D, Grid3D, Grid2DWithYZOverflow, FixedGrid
    params: list[str]      # runtime parameters, in order
    constexprs: list[str]  # constexpr parameters (XBLOCK, R0_BLOCK, ...)
    configs: list[dict] = field(default_factory=list)   # Inductor's configurations: {kwargs, num_warps, num_stages}
    size_hints: dict = field(default_factory=dict)      # the sizes it generated for, rounded up: {x, y, r0_}


_KERNEL_KINDS = ("pointwise", "persistent_reduction", "reduction", "template", "split_scan", "foreach",
                 "cooperative_reduction", "user_autotune")
_GRIDS = ("Grid1D", "Grid2D", "Grid3D", "Grid2DWithYZOverflow")


def parse_kernel(name: str, text: str) -> Kernel:
    """One `async_compile.triton(...)` source: its kernel function and how Inductor launches it."""
    kind = next((k for k in _KERNEL_KINDS if f"@triton_heuristics.{k}(" in text), None)
    if kind not in ("pointwise", "persistent_reduction", "reduction", "template"):
        raise NoStarter(f"Inductor made a {kind or 'unknown'} kernel ({name}), which the generator does not launch "
                        "(pointwise, reduction and template kernels only)")
    grid = re.search(r"'grid_type':\s*'(\w+)'", text)
    grid_type = grid.group(1) if grid else "Grid1D"
    if kind == "template" and grid_type != "FixedGrid":
        raise NoStarter(f"template kernel {name} uses Inductor's {grid_type} launch grid; the generator handles the "
                        "FixedGrid that the wrapper computes")
    if kind != "template" and grid_type not in _GRIDS:
        raise NoStarter(f"kernel {name} uses Inductor's {grid_type} launch grid, which the generator does not handle")
    try:
        tree = ast.parse(text)
    except SyntaxError:
        raise NoStarter(f"kernel {name}: Inductor's source does not parse") from None
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    fn = next((f for f in functions if f.name == name), None)
    if fn is None:
        raise NoStarter(f"kernel {name}: no function named {name} in Inductor's output")
    # Functions Inductor defines beside the kernel (scan combine functions): kept, renamed per kernel
    extra = [f.name for f in functions if f is not fn]
    parts = ["@triton.jit\n" + ast.get_source_segment(text, f) for f in functions if f is not fn]
    parts.append("@triton.jit\n" + ast.get_source_segment(text, fn))
    source = "\n\n\n".join(parts) + "\n"
    for helper in extra:
        source = re.sub(rf"\b{re.escape(helper)}\b", f"{helper}__{name}", source)
    params, constexprs = [], []
    for a in fn.args.args:
        is_constexpr = a.annotation is not None and "constexpr" in ast.unparse(a.annotation)
        (constexprs if is_constexpr else params).append(a.arg)
    unknown = [c for c in constexprs if c not in ("XBLOCK", "YBLOCK", "ZBLOCK", "R0_BLOCK")]
    if unknown:
        raise NoStarter(f"kernel {name} takes constexpr {', '.join(unknown)}, which the generator cannot choose")
    if kind == "template" and (switchable := tf32x3_switch(name, source, text)) is not None:
        source, constexprs = switchable, constexprs + ["TF32X3"]
    configs, size_hints = inductor_configs(text)
    return Kernel(name, source, kind, "FixedGrid" if kind == "template" else grid_type, params, constexprs,
                  configs, size_hints)


# A template's fp32 product: `acc += tl.dot(a, b, allow_tf32=ALLOW_TF32, ...)`, one statement on its line
_FP32_DOT = re.compile(r"^(?P<indent>[ \t]*)(?P<target>\w+ \+?= )tl\.dot\((?P<operands>[^()]*?),\s*"
                       r"allow_tf32=ALLOW_TF32(?P<rest>[^()]*)\)[ \t]*$", re.M)


def tf32x3_switch(name: str, source: str, text: str) -> str | None:
    """A GEMM template over fp32 operands, with `tf32x3` as a constexpr switch (TF32X3): Inductor's template, with
    TF32 off as torch's default is, multiplies on the FMA units (cuBLAS's SGEMM does the same, faster); 3xTF32
    (each operand split into two TF32 parts, three tensor-core products) keeps about fp32's accuracy on the tensor
    cores, as kloop's convolution does. Off by default; timed at generation on a GPU (starter_tune.py) and
    verified by the evaluator like any setting. None where the template has no such product."""
    if not re.search(r"ALLOW_TF32\s*:\s*tl\.constexpr\s*=\s*False", source) or \
            not all(re.search(rf"'{arg}':\s*'\*fp32'", text) for arg in ("arg_A", "arg_B")):
        return None

    def switch(m: re.Match) -> str:
        pad, target, operands, rest = m["indent"], m["target"], m["operands"], m["rest"]
        return (f"{pad}if TF32X3:\n{pad}    {target}tl.dot({operands}, input_precision=\"tf32x3\"{rest})\n"
                f"{pad}else:\n{pad}    {target}tl.dot({operands}, allow_tf32=ALLOW_TF32{rest})")

    switched, count = _FP32_DOT.subn(switch, source)
    if count == 0:
        return None
    return re.sub(rf"(def {re.escape(name)}\([^)]*)\)", r"\1, TF32X3 : tl.constexpr)", switched, count=1)


def inductor_configs(text: str) -> tuple[list[dict], dict]:
    """The configurations Inductor's heuristics give a kernel (its decorator, run with `cached_autotune` captured
    instead of compiling anything): [{kwargs, num_warps, num_stages}] in Inductor's order, and the size hints they
    were made for ({x: 1024, r0_: 2048}); ([], {}) where they cannot be had (this module's defaults then apply)."""

    from torch._inductor.runtime import triton_helpers, triton_heuristics

    captured: list = []
    hints: dict = {}

    def capture_configs(size_hints, configs, *args, **kwargs):
        captured.extend(configs)
        hints.update(size_hints if isinstance(size_hints, dict) else {})
        return lambda fn: fn

    # @triton.jit reads the kernel's source: from linecache, as from a file
    filename = f"<inductor kernel {hashlib.sha256(text.encode()).hexdigest()[:12]}>"
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    try:  # the module's driver selection is for running kernels, which this does not
        with mock.patch.object(triton_heuristics, "cached_autotune", capture_configs), \
                mock.patch.object(triton_helpers, "set_driver_to_gpu", lambda: None), \
                mock.patch.object(triton_helpers, "set_driver_to_cpu", lambda: None):
            exec(compile(text, filename, "exec"), {"__file__": filename})
    except Exception:  # an Inductor version whose heuristics need more than the decorator: fixed defaults instead
        return [], {}
    finally:
        linecache.cache.pop(filename, None)
    return [{"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages} for c in captured], \
        {k: v for k, v in hints.items() if isinstance(v, int)}


def interpreter_blocks(k: Kernel) -> dict:
    """Block sizes for the CPU interpreter (INTERPRETER_TILE): a reduction's whole row in one tile (up to 4096),
    as many rows as fit; a pointwise tile as large as the data, up to 4096 (64 x 64 for 2-D tiles)."""
    x, y, r = (k.size_hints.get(axis, 1024) for axis in ("x", "y", "r0_"))
    if k.kind == "pointwise":
        return {"XBLOCK": min(x, 4096)} if k.constexprs == ["XBLOCK"] else {"XBLOCK": min(x, 64), "YBLOCK": min(y, 64)}
    if k.kind == "persistent_reduction":
        return {"XBLOCK": max(1, min(x, INTERPRETER_TILE // r))}
    if k.kind == "reduction":
        r0_block = min(r, 4096)
        return {"R0_BLOCK": r0_block, "XBLOCK": max(1, min(x, INTERPRETER_TILE // r0_block))}
    return {}


def helper_sources(names: set[str]) -> dict[str, str]:
    """Inductor's triton_helpers functions that the kernels call, each renamed `_th_<name>`, with the helpers they
    call in turn; refuses helpers that read Inductor's own module globals."""
    import inspect

    from torch._inductor.runtime import triton_helpers

    available = {n for n, v in vars(triton_helpers).items() if hasattr(v, "fn") and callable(getattr(v, "fn"))}
    pending, done = sorted(names), {}
    while pending:
        name = pending.pop()
        if name in done:
            continue
        if name not in available:
            raise NoStarter(f"the kernels call triton_helpers.{name}, which is not a Triton function to copy")
        source = textwrap.dedent(inspect.getsource(getattr(triton_helpers, name).fn))
        tree = ast.parse(source).body[0]
        reads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        local = {a.arg for a in tree.args.args} | {n.id for n in ast.walk(tree)
                                                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        calls = (reads - local) & available
        import builtins
        foreign = {r for r in reads - local - available - {"tl", "math", "libdevice", "triton"}
                   if not hasattr(builtins, r)}
        if foreign:
            raise NoStarter(f"triton_helpers.{name} reads {', '.join(sorted(foreign))} from Inductor's runtime")
        pending.extend(calls - set(done))
        done[name] = _rename_helpers(source, available)
    return done


def _rename_helpers(source: str, helpers: set[str]) -> str:
    """Bare references to helpers become `_th_<name>`; `triton_helpers.<name>` too; `math.` / `tl_math.` become
    `tl.math.`; the decorator becomes plain `@triton.jit`."""
    source = re.sub(r"\btriton_helpers\.(\w+)", lambda m: HELPER_PREFIX + m.group(1), source)
    source = re.sub(r"(?<![\w.])tl_math\.", "tl.math.", source)
    source = re.sub(r"(?<![\w.])math\.", "tl.math.", source)
    pattern = r"(?<![\w.])(" + "|".join(sorted(map(re.escape, helpers), key=len, reverse=True)) + r")\b(?!\s*=)"
    if helpers:
        source = re.sub(pattern, lambda m: HELPER_PREFIX + m.group(1), source)
    return re.sub(r"^@triton\.jit\b.*$", "@triton.jit", source, count=1, flags=re.M)


def _with_default(values: list, default) -> list:
    return values if default in values else sorted(values + [default])


def kernel_tunables(i: int, k: Kernel, interpreter: bool = False) -> tuple[dict[str, list], dict]:
    """The tunables of kernel i (`K<i>_<NAME>`) with their values and defaults: Inductor's first configuration
    where its heuristics gave one, else this module's; under the interpreter, block sizes that make few programs."""
    p = f"K{i}_"
    first = k.configs[0] if k.configs else {"kwargs": {}, "num_warps": None, "num_stages": None}
    if interpreter:
        first = {**first, "kwargs": {**first["kwargs"], **interpreter_blocks(k)}}
    tunables, defaults = {}, {}

    def add(name, values, fallback, inductor_value=None):
        default = inductor_value if isinstance(inductor_value, int) and inductor_value > 0 else fallback
        tunables[p + name], defaults[p + name] = _with_default(list(values), default), default

    kwargs = first["kwargs"]
    if k.kind == "template":
        add("NUM_WARPS", NUM_WARPS, 4, first["num_warps"])
        add("NUM_STAGES", NUM_STAGES, 2, first["num_stages"])
        if "TF32X3" in k.constexprs:
            add("TF32X3", [0, 1], 0)
        return tunables, defaults
    if k.kind == "pointwise" and k.constexprs == ["XBLOCK"]:
        add("XBLOCK", POINTWISE_XBLOCK, 1024, kwargs.get("XBLOCK"))
    elif k.kind == "persistent_reduction":
        add("XBLOCK", PERSISTENT_XBLOCK, 8, kwargs.get("XBLOCK"))
    elif k.kind == "reduction":
        add("XBLOCK", LOOPED_XBLOCK, 1, kwargs.get("XBLOCK"))
        add("R0_BLOCK", LOOPED_R0_BLOCK, 1024, kwargs.get("R0_BLOCK"))
    for c in k.constexprs:  # every other tile (a tiled pointwise kernel's, a tiled reduction's YBLOCK): Inductor's value
        if c.endswith("BLOCK") and p + c not in tunables and not (c == "R0_BLOCK" and k.kind == "persistent_reduction"):
            add(c, TILE_BLOCK, 32 if c == "XBLOCK" else 16, kwargs.get(c))
    add("NUM_WARPS", NUM_WARPS, 8 if k.kind != "pointwise" else 4, first["num_warps"])
    if k.kind == "reduction":
        add("NUM_STAGES", NUM_STAGES, 1, first["num_stages"])
    return tunables, defaults


def kernel_choices(i: int, k: Kernel, defaults: dict) -> list[dict]:
    """Inductor's configurations of kernel i as settings of its tunables (`defaults`: that kernel's), the defaults
    first; a configuration that sets what the starter does not tune is left out."""
    settings = [dict(defaults)]
    for config in k.configs:
        setting = {f"K{i}_{name}": value for name, value in config["kwargs"].items()}
        setting[f"K{i}_NUM_WARPS"] = config["num_warps"]
        if f"K{i}_NUM_STAGES" in defaults:
            setting[f"K{i}_NUM_STAGES"] = config["num_stages"]
        if set(setting) <= set(defaults) and all(isinstance(v, int) and v > 0 for v in setting.values()):
            settings.append({**defaults, **setting})
    if f"K{i}_TF32X3" in defaults:  # each configuration also on the tensor cores (3xTF32)
        settings += [{**s, f"K{i}_TF32X3": 1} for s in settings]
    return _distinct(settings)


def _distinct(settings: list[dict]) -> list[dict]:
    return [s for n, s in enumerate(settings) if s not in settings[:n]]


def launcher(i: int, k: Kernel) -> str:
    """`_launch_<i>(*runtime args)`: the grid from the numels and blocks (Inductor's grid type), then one launch."""
    p = f"K{i}_"
    stages = f", num_stages={p}NUM_STAGES" if k.kind in ("reduction", "template") else ""
    if k.kind == "template":  # FixedGrid: the wrapper computed the grid for the template's own tile sizes
        args = ", ".join(k.params)
        return (f"def _launch_{i}({args}, _grid_0, _grid_1, _grid_2):\n"
                f"    if _grid_0 == 0 or _grid_1 == 0 or _grid_2 == 0:\n        return\n"
                f"    {k.name}[(_grid_0, _grid_1, _grid_2)]({args}, "
                + "".join(f"{c}={p}{c}, " for c in k.constexprs) + f"num_warps={p}NUM_WARPS{stages})\n")
    args = ", ".join(k.params)
    body = []
    for c in k.constexprs:
        if c == "R0_BLOCK" and k.kind == "persistent_reduction":
            body.append("R0_BLOCK = _next_power_of_2(r0_numel)")
        else:
            body.append(f"{c} = {p}{c}")
    if k.kind == "persistent_reduction" and "XBLOCK" in k.constexprs:
        rows = "R0_BLOCK" if "R0_BLOCK" in k.constexprs else "_next_power_of_2(r0_numel)"
        body.append(f"XBLOCK = max(1, min(XBLOCK, {MAX_TILE_ELEMENTS} // {rows}))")
    programs = {}
    for axis in "xyz":
        numel, block = f"{axis}numel", f"{axis.upper()}BLOCK"
        if numel not in k.params:
            programs[axis] = "1"
        else:
            programs[axis] = f"(({numel}) + {block} - 1) // {block}" if block in k.constexprs else f"({numel})"
    if k.grid == "Grid2DWithYZOverflow":  # as Inductor: y programs past 65535 fold into z; the kernel unfolds them
        body.append(f"y_grid_raw = {programs['y']}")
        body.append(f"y_grid_div = (y_grid_raw + {MAX_Y_GRID - 1}) // {MAX_Y_GRID}")
        body.append(f"gx, gy, gz = {programs['x']}, 0 if y_grid_div == 0 else "
                    "(y_grid_raw + y_grid_div - 1) // y_grid_div, y_grid_div")
    else:
        body.append(f"gx, gy, gz = {programs['x']}, {programs['y']}, {programs['z']}")
    body.append("if gx == 0 or gy == 0 or gz == 0:\n        return")
    keywords = ", ".join(f"{c}={c}" for c in k.constexprs)
    body.append(f"{k.name}[(gx, gy, gz)]({args}, {keywords + ', ' if keywords else ''}num_warps={p}NUM_WARPS"
                f"{stages})")
    lines = "\n    ".join(body)
    return f"def _launch_{i}({args}):\n    {lines}\n"


# Wrapper statements with nothing to do in a candidate: argument clean-up, assertions on the inputs Inductor was
# compiled for, the device and stream the caller already has.
_DROPPED_CALLS = {"args.clear", "assert_size_stride", "assert_alignment", "torch.cuda.set_device",
                  "torch.xpu.set_device", "torch.cuda.synchronize"}
_STREAM_LOOKUPS = {"get_raw_stream", "torch.cuda.current_stream"}
_DEVICE_GUARDS = ("torch.cuda._DeviceGuard", "torch.xpu._DeviceGuard", "torch.cuda.device")
_ALLOCATORS = {"empty_strided_cuda", "empty_strided_cpu", "empty_strided_xpu", "empty_strided"}
_TENSOR_METHODS = {"zero_", "fill_", "size", "stride", "storage_offset", "dim"}
# The convolutions traced as kloop::convolution (agent/kernels/inductor_conv.py), computed by its Triton kernel.
CONV_OP, CONV_LAUNCHER = "torch.ops.kloop.convolution.default", "_conv"
# Each call of Inductor's wrapper that kloop's own Triton computes, and the candidate's launcher for it: the ops
# traced as one (a convolution, a recurrent layer: agent/kernels/inductor_rnn.py) and the library calls Inductor
# still makes (cuDNN, cuBLAS: kloop's GEMM, agent/kernels/inductor_gemm.py).
OWN_LAUNCHERS = {CONV_OP: CONV_LAUNCHER, "extern_kernels.convolution": CONV_LAUNCHER,
                 "torch.ops.kloop.recurrent.default": "_recurrent", "extern_kernels.mm": "_mm",
                 "extern_kernels.addmm": "_addmm", "extern_kernels.bmm": "_bmm", "extern_kernels.baddbmm": "_baddbmm"}


class _CallTranslator(ast.NodeTransformer):
    """Inductor's `call` body as a candidate's: launches through `_launch_<i>`, allocations on `device`."""

    def __init__(self, kernels: dict[str, int]):
        self.kernels = kernels

    def visit_With(self, node: ast.With):
        if all(isinstance(item.context_expr, ast.Call) and ast.unparse(item.context_expr.func) in _DEVICE_GUARDS
               for item in node.items):
            body = []
            for stmt in node.body:
                kept = self.visit(stmt)
                body += kept if isinstance(kept, list) else [] if kept is None else [kept]
            return body
        return self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr):
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in _DROPPED_CALLS:
            return None
        return self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign):
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) in _STREAM_LOOKUPS:
            return None
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        func = ast.unparse(node.func)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "run" and isinstance(node.func.value, ast.Name):
            name = node.func.value.id
            if name not in self.kernels:
                raise NoStarter(f"Inductor's wrapper launches {name}, which is not one of its Triton kernels")
            extra = [kw.arg for kw in node.keywords if kw.arg != "stream"]
            if extra:
                raise NoStarter(f"Inductor launches {name} with {', '.join(map(str, extra))}, which the generator "
                                "does not pass")
            return ast.copy_location(ast.Call(ast.Name(f"_launch_{self.kernels[name]}", ast.Load()), node.args, []),
                                     node)
        if func in _ALLOCATORS:
            device = [kw for kw in node.keywords if kw.arg == "device"]
            keywords = [kw for kw in node.keywords if kw.arg != "device"]
            if device or len(node.args) != 3 or keywords:
                raise NoStarter(f"Inductor allocates with {ast.unparse(node)}, which the generator does not translate")
            return ast.copy_location(ast.Call(ast.Name("_empty_strided", ast.Load()),
                                              [ast.Name("device", ast.Load()), *node.args], []), node)
        if func == "reinterpret_tensor":
            node.func = ast.Name("_reinterpret_tensor", ast.Load())
        if func in OWN_LAUNCHERS:
            node.func = ast.Name(OWN_LAUNCHERS[func], ast.Load())
        return node


def translate_call(wrapper: str, kernels: dict[str, int], function: str = "_inductor_call") -> str:
    """Inductor's `call(args)` as `<function>(args, device)`: allocations, views, launches. NoStarter where
    it calls anything else (a library: extern_kernels.mm; a PyTorch fallback: aten.*)."""
    tree = ast.parse(wrapper)
    call = None
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            call = node
    if call is None:
        raise NoStarter("Inductor's wrapper has no call(args) function")
    body = _CallTranslator(kernels).visit(ast.Module(body=call.body, type_ignores=[]))
    definition = ast.parse(f"def {function}(args, device):\n    pass\n").body[0]
    definition.body = body.body or definition.body
    source = ast.unparse(ast.fix_missing_locations(ast.Module(body=[definition], type_ignores=[]))) + "\n"
    allowed = {"_empty_strided", "_reinterpret_tensor", "len", "max", "min", "abs", "int"} | \
        set(OWN_LAUNCHERS.values()) | {f"_launch_{i}" for i in kernels.values()}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr in _TENSOR_METHODS:
                continue
            if func not in allowed:
                raise NoStarter(f"Inductor's code for this reference makes {_what(func)} ({func}) instead of "
                                "generating Triton, so there is no standalone starter")
    return source


def _what(func: str) -> str:
    if "extern_kernels" in func:
        return "a library call"
    if func.startswith(("aten.", "torch.")):
        return "a PyTorch fallback"
    return "a call"


_SOURCE = re.compile(r"^L\['args'\]\[(\d+)\](?:\.(size|stride)\(\)\[(\d+)\]|\.storage_offset\(\))?$")
# an int attribute of one of Model's modules (capture's module_ints): `L['module']._modules['attn'].n_head`
_MODULE_SOURCE = re.compile(r"^L\['module'\]((?:\._modules\['\w+'\])*\.[A-Za-z_]\w*)$")


def module_int(model, source: str):
    """The value of a graph input that _MODULE_SOURCE matched, read from model by attribute lookups (no eval):
    `L['module']._modules['attn'].n_head` is model._modules['attn'].n_head."""
    path = _MODULE_SOURCE.match(source).group(1)
    owner = model
    for name in re.findall(r"\._modules\['(\w+)'\]", path):
        owner = owner._modules[name]
    return getattr(owner, path.rsplit(".", 1)[1])


def argument_expressions(sources: list[str]) -> list[str]:
    """Each graph input as an expression over `flat` (the weights, then the forward's inputs), or over ModelNew's
    `self` for an int attribute of its modules (ModelNew is a Model: the same modules, built with the same
    arguments)."""
    out = []
    for s in sources:
        if m := _MODULE_SOURCE.match(s):
            out.append(f"self{m.group(1)}")
            continue
        m = _SOURCE.match(s)
        if not m:
            raise NoStarter(f"torch.compile made a graph input the generator cannot rebuild: {s}")
        index, kind, dim = m.groups()
        if kind == "size":
            out.append(f"flat[{index}].shape[{dim}]")
        elif kind == "stride":
            out.append(f"flat[{index}].stride({dim})")
        elif s.endswith(".storage_offset()"):
            out.append(f"flat[{index}].storage_offset()")
        else:
            out.append(f"flat[{index}]")
    return out


def reference_part(source: str) -> str:
    """The reference module without get_inputs/get_init_inputs and KLOOP_* settings (nothing a candidate needs,
    and hidden variants are never shown). A top-level import of a package the rules refuse a candidate (einops in
    level 3's Mamba problems: only the reference's forward, which ModelNew replaces, uses it) becomes a probe, as the
    rules allow one: in a try that does without it."""
    from tools.rules import _module_allowed, _probe_allowed

    tree = ast.parse(source)
    lines = source.split("\n")
    edits = []   # (first line, last line, what replaces them)
    for node in tree.body:
        names = [t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)]
        if (isinstance(node, ast.FunctionDef) and node.name in ("get_inputs", "get_init_inputs")) or \
                any(n.startswith("KLOOP_") for n in names):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            edits.append((first, node.end_lineno, []))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            if any(not _module_allowed(m) for m in modules) and all(_probe_allowed(m) for m in modules):
                body = lines[node.lineno - 1:node.end_lineno]
                edits.append((node.lineno, node.end_lineno, ["try:  # the reference's forward alone uses it"] +
                               ["    " + line for line in body] + ["except ImportError:", "    pass"]))
    for first, last, replacement in sorted(edits, reverse=True):
        lines[first - 1:last] = replacement
    return "\n".join(lines).strip() + "\n"


PRELUDE = '''import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice
'''

RUNTIME = {  # what launchers and the call use besides torch: each starter gets those it calls, no others
    "_next_power_of_2": '''
def _next_power_of_2(n):
    p = 1
    while p < n:
        p *= 2
    return p
''',
    "_empty_strided": '''
def _empty_strided(device, size, stride, dtype):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)
''',
    "_reinterpret_tensor": '''
def _reinterpret_tensor(t, size, stride, offset):
    return t.as_strided(size, stride, t.storage_offset() + offset)
''',
    "_check_fixed": '''
def _check_fixed(flat):
    for i, dim, size in _FIXED_SIZES:
        if flat[i].shape[dim] != size:
            raise ValueError(f"parameter or buffer {i} has {flat[i].shape[dim]} in dim {dim}; this starter's kernels "
                             f"were generated for {size}")
''',
    "_layout": '''
def _layout(values):
    return tuple((tuple(v.shape), tuple(v.stride()), v.storage_offset(), str(v.dtype))
                 if isinstance(v, torch.Tensor) else v for v in values)
''',
}


def layout(values: list) -> tuple:
    """What the main-shape kernels were compiled for: the candidate's own `_layout` of `flat`."""
    import torch

    namespace = {"torch": torch}
    exec(RUNTIME["_layout"], namespace)  # noqa: S102 (kloop's own helper, the one the candidate carries)
    return namespace["_layout"](values)


def _kernel_texts(wrapper: str) -> dict[str, str]:
    """Each `name = async_compile.triton('name', source, ...)` of Inductor's wrapper: name -> source."""
    texts = {}
    for node in ast.parse(wrapper).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "async_compile.triton"):
            name, text = (a.value for a in node.value.args[:2])
            texts[name] = text
    return texts


def build_candidate(wrapper: str, sources: list[str], reference_source: str, single_output: bool,
                    interpreter: bool = False, main: tuple[str, list[str], tuple] | None = None,
                    fixed: tuple = ()) -> Generated:
    """The standalone candidate module from Inductor's wrapper source and its graph inputs (interpreter: for the
    CPU interpreter, see INTERPRETER_TILE). main: Inductor's wrapper and graph inputs for the main shape compiled
    with static sizes, and that shape's `layout`; the candidate runs those kernels on exactly that layout (their
    tunables are the starter's) and the dynamic ones on any other. fixed: the parameter and buffer sizes the
    dynamic kernels were captured with as constants (fixed_sizes); the candidate refuses other sizes (ValueError)
    rather than computing with them."""
    from agent.kernels import inductor_conv

    texts = _kernel_texts(wrapper)
    index = {name: i for i, name in enumerate(texts)}
    call = translate_call(wrapper, index)  # first: a library call is the reason, also where no Triton was made
    if main is not None:
        main_wrapper, main_sources, main_layout = main
        for name in _kernel_texts(main_wrapper):  # Inductor names them as it named the dynamic ones
            main_wrapper = re.sub(rf"\b{re.escape(name)}\b", f"{name}_main", main_wrapper)
        main_texts = _kernel_texts(main_wrapper)
        main_index = {name: len(texts) + i for i, name in enumerate(main_texts)}
        call += "\n\n" + translate_call(main_wrapper, main_index, "_inductor_call_main")
        texts.update(main_texts)
    convolves = re.search(rf"\b{CONV_LAUNCHER}\(", call) is not None
    own = own_parts(call)
    if not texts and not convolves and not own:
        raise NoStarter("Inductor generated no Triton kernel for this reference (its code only allocates, views "
                        "or returns its inputs)")
    kernels = [parse_kernel(name, text) for name, text in texts.items()]
    if interpreter:  # the interpreter calls a reduction's combine function per element: 90 s for a 16 x 1536 softmax
        for k in kernels:
            k.source = re.sub(r"\btriton_helpers\.(max|min)2\(", lambda m: f"tl.{m.group(1)}(", k.source)
            # and cannot mask with a block & a scalar comparison (the batched GEMM template's batch bound)
            k.source = k.source.replace("& (idx_q < BATCH)", "& (idx_m * 0 + idx_q < BATCH)")
    used = set()
    for k in kernels:
        used |= set(re.findall(r"\btriton_helpers\.(\w+)", k.source))
    helpers = helper_sources(used)
    if interpreter and "welford" in helpers:
        helpers["welford"] = INTERPRETER_WELFORD
    searched = range(len(index), len(kernels)) if main is not None else range(len(kernels))
    tunables, defaults, choices = _tunables(kernels, searched, convolves, own, interpreter)
    parts = [PRELUDE]
    parts.append("\n".join(f"{name} = {value!r}" for name, value in defaults.items()) + "\n")
    parts += [f"\n@triton.jit\n{src.split(chr(10), 1)[1]}" for src in helpers.values()]
    parts += ["\n" + _rename_helpers(k.source, set(helpers)) for k in kernels]
    parts += ["\n" + launcher(i, k) for i, k in enumerate(kernels)]
    if convolves:
        parts.append("\n" + inductor_conv.candidate_source())
    parts += ["\n" + part.candidate_source(call) for part in own]
    lines = [f"outs = {_call_expression(sources, '_inductor_call')}"]
    if fixed:
        lines.insert(0, "_check_fixed(flat)")
        call = f"_FIXED_SIZES = {tuple(fixed)!r}\n\n\n" + call
    if main is not None:  # the main kernels' layout also holds the modules' ints the dynamic ones take
        main_call = f"outs = {_call_expression(main_sources, '_inductor_call_main')}"
        ints = [e for s, e in zip(sources, argument_expressions(sources)) if _MODULE_SOURCE.match(s)]
        laid_out = f"flat + [{', '.join(ints)}]" if ints else "flat"
        lines = [f"if _layout({laid_out}) == _MAIN_LAYOUT:  # the shape the main kernels were compiled for",
                 f"    {main_call}", "else:", *(f"    {line}" for line in lines)]
        call = f"_MAIN_LAYOUT = {main_layout!r}\n\n\n" + call
    body = "\n        ".join(lines)
    code = "\n".join(parts[1:] + [call, body])
    parts += [helper for name, helper in RUNTIME.items() if re.search(rf"\b{name}\(", code)]
    parts.append("\n" + call)
    parts.append("\n# -- the reference's module (for Model's parameters) " + "-" * 60 + "\n")
    parts.append(reference_part(reference_source))
    result = "outs[0]" if single_output else "tuple(outs)"
    parts.append(f'''

class ModelNew(Model):
    """The reference's parameters, computed by the Triton kernels Inductor generated for it."""

    def forward(self, *inputs):
        flat = list(self.parameters()) + list(self.buffers()) + list(inputs)
        {body}
        return {result}
''')
    source = "\n".join(p.rstrip("\n") + "\n" for p in parts)
    notes = _notes(kernels, len(index) if main is not None else None, convolves, own)
    return Generated(source, tunables, defaults, notes, [k.name for k in kernels], choices)


def _tunables(kernels: list[Kernel], searched: range, convolves: bool, own: list, interpreter: bool
              ) -> tuple[dict, dict, list]:
    """The candidate's tunables (those of the kernels in `searched`, the convolution's and kloop's own parts'),
    every constant's default, and the configurations a search starts from (none under the interpreter)."""
    from agent.kernels import inductor_conv

    tunables, defaults, choices = {}, {}, []
    if convolves:
        conv_defaults = inductor_conv.INTERPRETER_DEFAULTS if interpreter else inductor_conv.DEFAULTS
        tunables.update({name: _with_default(values, conv_defaults[name])
                         for name, values in inductor_conv.TUNABLES.items()})
        defaults.update(conv_defaults)
    for part in own:
        part_defaults = part.INTERPRETER_DEFAULTS if interpreter else part.DEFAULTS
        tunables.update({name: _with_default(values, part_defaults[name]) for name, values in part.TUNABLES.items()})
        defaults.update(part_defaults)
    for i, k in enumerate(kernels):
        t, d = kernel_tunables(i, k, interpreter)
        defaults.update(d)
        if i in searched:  # with a main path, the dynamic kernels (other shapes: never timed) keep Inductor's first
            tunables.update(t)
            choices.append(kernel_choices(i, k, d))
    if convolves:
        choices.append(_distinct([dict(conv_defaults)] + inductor_conv.CONFIGS))
    choices += [_distinct([dict(part.DEFAULTS)] + part.CONFIGS) for part in own]
    if interpreter:  # nothing is timed under the interpreter
        choices = []
    return tunables, defaults, choices


def _notes(kernels: list[Kernel], main_from: int | None, convolves: bool, own: list) -> str:
    """What the starter is, for the policy. main_from: the first of the main shape's kernels (None: no main path)."""
    names = ", ".join(k.name for k in kernels)
    notes = (f"torch.compile (Inductor) Triton for the reference: {len(kernels)} kernel(s) ({names}), made "
             "standalone; its block sizes, warps and stages are tunables")
    if main_from is not None:
        notes += (f"; the main shape runs the kernels Inductor compiled for its sizes (K{main_from} on, the "
                  "tunables), any other shape those compiled for dynamic sizes (Inductor's first configuration)")
    if convolves:
        notes += ("; its convolutions run kloop's implicit-GEMM Triton kernel (_conv_kernel, sizes at run time, "
                  "the weights copied output channels innermost while CONV_W_RELAYOUT; a depthwise one "
                  "_conv_depthwise_kernel while CONV_DIRECT), tuned by the CONV_* constants")
    notes += "".join(f"; {part.NOTE}" for part in own)
    return notes


def own_parts(call: str) -> list:
    """kloop's own kernel modules that a translated call launches besides the convolution, in the order a candidate
    holds them: the GEMM (a library call's launcher, or a recurrent layer's input projections), the recurrent
    layers."""
    from agent.kernels import inductor_gemm, inductor_rnn

    recurrent = re.search(r"\b_recurrent\(", call) is not None
    gemm = recurrent or re.search(r"\b_(mm|addmm|bmm|baddbmm)\(", call) is not None
    return [part for part, used in ((inductor_gemm, gemm), (inductor_rnn, recurrent)) if used]


def _call_expression(sources: list[str], function: str) -> str:
    """`<function>([graph inputs over flat], <device>)`, as ModelNew.forward calls the translated wrapper."""
    arguments = argument_expressions(sources)
    first_tensor = next((i for i, s in enumerate(sources) if _SOURCE.match(s) and _SOURCE.match(s).group(2) is None
                         and not s.endswith(")")), None)
    device = f"{arguments[first_tensor]}.device" if first_tensor is not None else "None"
    return f"{function}([{', '.join(arguments)}], {device})"


def generate_here(target_spec: str, small: bool) -> Generated:
    """The child process's work: load the target, run the reference once through Inductor's codegen, build the
    candidate, check it against the rules."""
    import torch

    from tools.inputs import DEVICE, make_inputs
    from tools.target import TargetError, load_target

    try:
        target = load_target(target_spec)
        module = target.module_for(target.shapes(small)[0])
    except TargetError as e:
        raise NoStarter(str(e)) from None
    try:
        torch.manual_seed(0)
        with torch.device(DEVICE):
            model = module.Model(*module.get_init_inputs()).to(DEVICE)  # as the referee runs it: train mode
        inputs = make_inputs(module, 0)
        with torch.no_grad():
            out = model(*inputs)
    except Exception as e:
        raise NoStarter(f"the reference fails: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    single = isinstance(out, torch.Tensor)
    if not single and not (isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out)):
        raise NoStarter(f"the reference returns a {type(out).__name__}, not tensors")
    try:
        fixed = fixed_sizes([tuple(t.shape) for t in [*model.parameters(), *model.buffers()]], target.state_shapes())
        wrapper, sources = capture(model, inputs, fixed=fixed, module_ints=bool(varying_ints(target.module_ints())))
    except NoStarter:
        raise
    except Exception as e:  # Inductor's own failures, one line
        if "NoValidChoicesError" in str(e):  # e.g. 1-D and transposed convolutions: a library call or nothing
            raise NoStarter("Inductor has no Triton template for an op of this reference (max-autotune with only "
                            "the TRITON backend found no valid choice), so there is no standalone starter") from None
        message = " ".join(str(e).split())[:300]
        raise NoStarter(f"torch.compile could not generate code for the reference: {type(e).__name__}: {message}") \
            from None
    interpreter = DEVICE.type != "cuda"
    generated = _checked(build_candidate(wrapper, sources, target.source, single, interpreter, fixed=fixed))
    try:  # the main shape's own kernels, as torch.compile makes them: where it falls short, dynamic ones serve it
        main_wrapper, main_sources = capture(model, inputs, dynamic=False)
        ints = [module_int(model, s) for s in sources if _MODULE_SOURCE.match(s)]
        main = (main_wrapper, main_sources, layout(list(model.parameters()) + list(model.buffers()) + inputs + ints))
        generated = _checked(build_candidate(wrapper, sources, target.source, single, interpreter, main, fixed))
    except Exception as e:  # noqa: BLE001
        message = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        generated = replace(generated, notes=f"{generated.notes}; no kernels of the main shape's own ({message})")
    return _timed(generated, module, model, inputs, out) if DEVICE.type == "cuda" else generated


def _checked(generated: Generated) -> Generated:
    """generated, if it parses and keeps the rules (tools/rules.py); else NoStarter."""
    from tools.rules import check_source

    try:
        reasons = check_source(generated.source)
    except SyntaxError as e:
        raise NoStarter(f"the generated candidate does not parse: {e}") from None
    if reasons:
        raise NoStarter(f"the generated candidate breaks a rule: {reasons[0]}")
    return generated


def _timed(generated: Generated, module, model, inputs: list, expected) -> Generated:
    """generated with the defaults timed fastest on this GPU (agent/kernels/starter_tune.py); as it was, the reason
    in its notes, where timing fails."""
    import torch

    from agent.kernels import starter_tune
    from tools.inputs import DEVICE

    def make_model(cls):
        torch.manual_seed(0)
        with torch.device(DEVICE):
            new = cls(*module.get_init_inputs()).to(DEVICE)
        new.load_state_dict(model.state_dict())
        return new

    try:
        return starter_tune.tune(generated, make_model, inputs, expected)
    except Exception as e:
        message = " ".join(str(e).split())[:200]
        return replace(generated, notes=f"{generated.notes}; defaults not timed ({type(e).__name__}: {message})")


def main(argv: list[str]) -> int:
    spec = argv[0]
    small = "--small" in argv[1:]
    try:
        reply = generate_here(spec, small).to_dict()
    except NoStarter as e:
        reply = {"error": str(e)}
    sys.stdout.write("\n" + json.dumps(reply) + "\n")
    return 0


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit now that the reply is written: at interpreter exit Inductor would shut down its compile-worker pool
    # (started for GEMM templates), which waited on workers still starting: a CPU-size ReLU took 13.8 s to return,
    # 7.3 s this way. The workers end by themselves when they see this process gone.
    os._exit(code)
