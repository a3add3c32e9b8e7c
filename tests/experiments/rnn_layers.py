"""kloop's recurrent layers against cuDNN on a GPU, the kernels alone (no evaluator): KernelBench level 3's sizes
(batch 10, 512 steps, input 128, hidden 256, 6 layers), LSTM and GRU, one and two directions.

    PYTHONPATH=. python3 tests/experiments/rnn_layers.py [OUT.json]

For each layer: cuDNN (the module's own forward), the launch-per-step kernel (RNN_PERSISTENT = 0, launched from
this process, so host launches bound it) and the one-launch-per-layer kernel (RNN_PERSISTENT = 1) at several tile
settings. Times are medians of 10 forwards (3 for the launch per step; CUDA events, q1-q3 beside), all in this one
process; the error is the relative L2 distance from the module's output in float64.
"""
import json
import sys

import torch

from agent.kernels import inductor_rnn

SIZES = dict(batch=10, steps=512, inputs=128, hidden=256, layers=6)
TILES = [(16, 16, 64, 2), (16, 32, 32, 4), (16, 32, 64, 4), (16, 64, 32, 4), (16, 32, 32, 8), (32, 32, 32, 4)]


def timed(fn, reps=10):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    q = torch.tensor(times).quantile(torch.tensor([0.25, 0.5, 0.75])).tolist()
    return {"median_ms": q[1], "q1_ms": q[0], "q3_ms": q[2]}


def error(out, want):
    return ((out.double() - want).norm() / want.norm()).item()


def layer_case(cls, bidirectional):
    torch.manual_seed(0)
    layer = cls(SIZES["inputs"], SIZES["hidden"], SIZES["layers"], batch_first=True, bidirectional=bidirectional)
    layer = layer.cuda().eval()
    directions = 2 if bidirectional else 1
    x = torch.rand(SIZES["batch"], SIZES["steps"], SIZES["inputs"], device="cuda")
    h0 = torch.rand(SIZES["layers"] * directions, SIZES["batch"], SIZES["hidden"], device="cuda")
    c0 = torch.rand_like(h0) if cls is torch.nn.LSTM else None
    hx = (h0, c0) if c0 is not None else h0
    with torch.no_grad():
        want = layer.double()(x.double(), tuple(t.double() for t in hx) if c0 is not None else h0.double())[0]
        layer.float()
        weights = [getattr(layer, n) for n in layer._flat_weights_names]
        rows = {"cudnn": {**timed(lambda: layer(x, hx)), "error": error(layer(x, hx)[0], want)}}

        def ours():
            return inductor_rnn._recurrent(x, h0, c0, weights, layer.mode, SIZES["layers"], bidirectional, True)[0]

        for persistent in (0, 1):
            for b, h, k, w in TILES if persistent else TILES[1:2]:
                inductor_rnn.RNN_PERSISTENT = persistent
                inductor_rnn.RNN_BLOCK_B, inductor_rnn.RNN_BLOCK_H, inductor_rnn.RNN_BLOCK_K = b, h, k
                inductor_rnn.RNN_NUM_WARPS = w
                name = f"{'layer' if persistent else 'step'} B{b} H{h} K{k} w{w}"
                rows[name] = {**timed(ours, reps=10 if persistent else 3), "error": error(ours(), want)}
    return rows


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    results = {}
    for cls in (torch.nn.LSTM, torch.nn.GRU):
        for bidirectional in (False, True):
            case = f"{cls.__name__}{' bidirectional' if bidirectional else ''}"
            results[case] = rows = layer_case(cls, bidirectional)
            base = rows["cudnn"]["median_ms"]
            for name, r in rows.items():
                print(f"{case:<20} {name:<24} {r['median_ms']:9.3f} ms [{r['q1_ms']:.3f}, {r['q3_ms']:.3f}] "
                      f"{base / r['median_ms']:6.2f}x cuDNN  error {r['error']:.2e}", flush=True)
    if len(sys.argv) > 1:
        json.dump({"gpu": torch.cuda.get_device_name(), "sizes": SIZES, "results": results},
                  open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
