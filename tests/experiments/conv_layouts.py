"""Why kloop's convolution trailed cuDNN, and what its loads' layout changes, on one GPU (not a test).

    python tests/experiments/conv_layouts.py KERNELBENCH [PROBLEM ...]   # e.g. kernelbench level2/7_* level1/54_*

For each KernelBench problem named (level/NUMBER_ globs; default: the convolutions below 0.9x torch.compile in
results/), the first convolution of its Model at its real size, computed as a starter computes it
(agent/kernels/inductor_conv._conv), each variant at the defaults and at every configuration of CONFIGS:
- before: the kernel as of a file given in BEFORE (an earlier inductor_conv.py, loaded as a module of its own);
- after: today's;
- x_cl: today's on a channels-last input (converted inside the timed call), at after's fastest configuration;
and beside them cuDNN (fp32 without TF32: kloop's reference and torch.compile's convolution) and, as a ceiling only,
after's fastest with plain TF32 dots (coarser than fp32: never a candidate). Every variant is checked against cuDNN
at fp32's tolerance before it is timed. Times: triton.testing.do_bench medians (L2 flushed), ms, in one process, side
by side. Also counts the SASS instructions of each variant's fastest kernel (HGMMA: wgmma, HMMA: mma.sync, LDGSTS:
cp.async, LDG). Prints one line per problem and variant; JSON to $OUT/conv_layouts.json.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from agent.kernels import inductor_conv  # noqa: E402
from matmul_hopper import sass_text  # noqa: E402  (this folder is first on sys.path)
from sass_evidence import count_ops  # noqa: E402
from tools.numerics import pin_numeric_flags  # noqa: E402

OUT = Path(os.environ.get("OUT") or ROOT / "out")
BUDGET_S = float(os.environ.get("BUDGET_S", 420))
SLOW = ["level2/7_*", "level2/24_*", "level2/43_*", "level2/47_*", "level2/48_*", "level2/79_*", "level2/90_*",
        "level1/50_*", "level1/54_*", "level1/59_*", "level1/67_*", "level1/69_*", "level1/76_*", "level1/77_*"]


def first_conv(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    model = module.Model(*module.get_init_inputs())
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.modules.conv._ConvNd))
    x = module.get_inputs()[0]
    return conv, x


def channels_last(x):
    if x.dim() == 5:
        return x.contiguous(memory_format=torch.channels_last_3d)
    if x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x.transpose(1, 2).contiguous().transpose(1, 2)


class Recorded:
    """A module's _conv_kernel keeping the kernel its last launch compiled; with tf32, IEEE off (TF32 dots): the
    tensor cores' ceiling for the tile, not a kernel to keep."""
    def __init__(self, launch, tf32: bool):
        self.launch, self.tf32, self.compiled = launch, tf32, None

    def __getitem__(self, grid):
        def run(*args, **kw):
            self.compiled = self.launch[grid](*args, **({**kw, "IEEE": False} if self.tf32 else kw))
        return run


def run_variant(module, conv, x, b, settings: dict, tf32: bool = False, convert=None):
    """module._conv's output (on convert(x) when given), and the kernel it ran."""
    module.__dict__.update(settings)
    original = module._conv_kernel
    module._conv_kernel = recorded = Recorded(original, tf32)
    try:
        y = module._conv(convert(x) if convert else x, conv.weight.detach(), b, list(conv.stride),
                         list(conv.padding), list(conv.dilation), conv.transposed, list(conv.output_padding),
                         conv.groups)
    finally:
        module._conv_kernel = original
    return y, recorded.compiled


def tensor_core_ops(compiled) -> dict:
    return count_ops(sass_text(compiled.asm["cubin"]), ("HGMMA", "HMMA", "LDGSTS", "LDG")) if compiled else {}


def fastest(module, conv, x, b, ref, configs, deadline, **variant) -> dict | None:
    best = None
    for settings in configs:
        if time.monotonic() > deadline:
            break
        y, compiled = run_variant(module, conv, x, b, settings, **variant)
        if not torch.allclose(y, ref, atol=1e-4, rtol=1e-4):
            return {"wrong": float((y - ref).abs().max().detach())}
        ms = triton.testing.do_bench(lambda: run_variant(module, conv, x, b, settings, **variant), warmup=5, rep=40)
        if best is None or ms < best["ms"]:
            best = {"ms": ms, "settings": settings, "sass": tensor_core_ops(compiled)}
    module.__dict__.update(module.DEFAULTS)
    return best


def problem(path: Path, before, deadline: float) -> dict:
    conv, x = first_conv(path)
    conv, x = conv.cuda(), x.cuda()
    b = None if conv.bias is None else conv.bias.detach()
    ref = conv(x)
    w = conv.weight
    c_in_g = w.shape[0] // conv.groups if conv.transposed else w.shape[1]
    row = {"problem": path.parent.name + "/" + path.stem, "x": list(x.shape), "w": list(w.shape),
           "stride": list(conv.stride), "padding": list(conv.padding), "groups": conv.groups,
           "transposed": conv.transposed, "c_in_g": c_in_g,
           "cudnn": {"ms": triton.testing.do_bench(lambda: conv(x), warmup=5, rep=40)}}
    configs = [inductor_conv.DEFAULTS] + [c for c in inductor_conv.CONFIGS if not c["CONV_DIRECT"]]
    if before is not None:
        row["before"] = fastest(before, conv, x, b, ref, configs, deadline)
    row["after"] = after = fastest(inductor_conv, conv, x, b, ref, configs, deadline)
    if after and "ms" in after:
        row["x_cl"] = fastest(inductor_conv, conv, x, b, ref, [after["settings"]], deadline + 60,
                              convert=channels_last)
        row["after tf32 (ceiling)"] = fastest(inductor_conv, conv, x, b, ref, [after["settings"]], deadline + 60,
                                              tf32=True)
    return row


def main() -> int:
    kb = Path(sys.argv[1])
    globs = sys.argv[2:] or SLOW
    paths = [p for g in globs for p in sorted(kb.glob(g.split("/")[0] + "/*.py"))
             if fnmatch.fnmatch(p.parent.name + "/" + p.name, g)]
    before = None
    if os.environ.get("BEFORE"):
        spec = importlib.util.spec_from_file_location("inductor_conv_before", os.environ["BEFORE"])
        before = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(before)
    pin_numeric_flags()
    OUT.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + BUDGET_S
    rows = []
    for path in paths:
        if time.monotonic() > deadline:
            print(f"{path.stem}: not reached (budget)")
            continue
        row = problem(path, before, deadline)
        rows.append(row)
        json.dump(rows, open(OUT / "conv_layouts.json", "w"), indent=1)
        cells = [f"{k} {v['ms']:.3f} ms ({row['cudnn']['ms'] / v['ms']:.2f}x cuDNN) {v.get('sass', '')}"
                 if "ms" in v else f"{k}: {v}" for k, v in row.items() if isinstance(v, dict)]
        print(f"{row['problem']} x{row['x']} w{row['w']} stride {row['stride']} padding {row['padding']}\n  "
              + "\n  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
