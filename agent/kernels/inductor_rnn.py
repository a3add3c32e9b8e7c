"""kloop's Triton recurrent layers: what an Inductor starter computes nn.LSTM, nn.GRU and nn.RNN with.

torch.compile makes no graph of a recurrent layer (Dynamo leaves `_VF.lstm` to PyTorch, which calls cuDNN), so the
starter generator (agent/kernels/inductor.py) traces each such module's forward as one opaque op,
`kloop::recurrent` (this module's `recurrent`, with symbolic output shapes), and Inductor generates Triton for
everything around it; the candidate computes the op with `_recurrent` below, whose source is copied into it verbatim
(`candidate_source`), its tunables as `RNN_*` constants.

Per layer: the input projection of every time step at once, x W_ih^T + b_ih, as one GEMM per direction (kloop's
own, agent/kernels/inductor_gemm.py); then the recurrence, where a step multiplies the previous hidden state by W_hh
for each gate of a (batch, hidden unit) tile (3xTF32 dot products over fp32, as the GEMM) and applies the gates
(`_recurrent_tile`): LSTM's i, f, g, o with its cell state, GRU's r, z, n, or the plain RNN's tanh or ReLU. A step
writes its hidden state into the layer's output sequence, where the next step reads it; the last step also writes
h_n (and c_n). With RNN_PERSISTENT (the default) the whole layer is one launch of `_recurrent_layer_kernel`: both
directions, a program per tile (up to one per multiprocessor), the programs of a direction meeting at a barrier
after every step, as cuDNN's persistent kernels do. Else a launch of `_recurrent_step_kernel` per step and
direction, the launches ordering the steps: level 3's 6-layer recurrences are 3072 or 6144 launches, bound by the
host that launches them. Sizes are runtime arguments, so one compiled kernel serves every shape.
Supported: any number of layers, bidirectional, batch_first, with or without biases, dropout 0 (or eval mode);
not: proj_size, unbatched or packed input (`unsupported` says which, and the generator makes no starter).
"""
from __future__ import annotations

import contextlib
import inspect
from unittest import mock

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from agent.kernels.inductor_gemm import _gemm

RNN_BLOCK_B = 16
RNN_BLOCK_H = 32
RNN_BLOCK_K = 32
RNN_NUM_WARPS = 4
RNN_PERSISTENT = 1

MODES = {"LSTM": 0, "GRU": 1, "RNN_TANH": 2, "RNN_RELU": 3}
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
TUNABLES = {"RNN_BLOCK_B": [16, 32, 64], "RNN_BLOCK_H": [16, 32, 64, 128], "RNN_BLOCK_K": [16, 32, 64],
            "RNN_NUM_WARPS": [1, 2, 4, 8], "RNN_PERSISTENT": [0, 1]}
DEFAULTS = {"RNN_BLOCK_B": RNN_BLOCK_B, "RNN_BLOCK_H": RNN_BLOCK_H, "RNN_BLOCK_K": RNN_BLOCK_K,
            "RNN_NUM_WARPS": RNN_NUM_WARPS, "RNN_PERSISTENT": RNN_PERSISTENT}
# Settings timed beside the defaults on a GPU (agent/kernels/starter_tune.py): more programs per step (narrow
# tiles) against fewer, deeper ones. The launch per step is not among them: at level 3's sizes it ran at 0.14-0.46x
# of the launch per layer (an H200, results/rnn-layers-h200/)
CONFIGS = [{"RNN_BLOCK_B": b, "RNN_BLOCK_H": h, "RNN_BLOCK_K": k, "RNN_NUM_WARPS": w, "RNN_PERSISTENT": 1}
           for b, h, k, w in [(16, 16, 64, 2), (16, 32, 64, 4), (16, 64, 32, 4), (16, 32, 32, 8)]]
# Under the CPU interpreter every program is Python over numpy tiles: few, large programs.
INTERPRETER_DEFAULTS = {**DEFAULTS, "RNN_BLOCK_B": 64, "RNN_BLOCK_H": 128, "RNN_BLOCK_K": 64}
NOTE = ("its recurrent layers run kloop's Triton recurrence (_recurrent: the input projections as one GEMM per "
        "layer, then while RNN_PERSISTENT one launch of _recurrent_layer_kernel per layer, its programs meeting at a "
        "barrier after every step, else a launch of _recurrent_step_kernel per step), tuned by the RNN_* constants")


# -- the op the generator traces ---------------------------------------------------------------------------------
@torch.library.custom_op("kloop::recurrent", mutates_args=())
def recurrent(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor | None, weights: list[torch.Tensor], mode: str,
              num_layers: int, bidirectional: bool, batch_first: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                 torch.Tensor]:
    """A recurrent layer's (output, h_n, c_n) as one op Inductor does not look into (used only while generating a
    starter); c_n is empty but for an LSTM."""
    biases = len(weights) == 4 * num_layers * (2 if bidirectional else 1)
    common = (biases, num_layers, 0.0, False, bidirectional, batch_first)
    if mode == "LSTM":
        out, h, c = torch._VF.lstm(x, (h0, c0), weights, *common)
        return out.contiguous(), h.contiguous(), c.contiguous()
    run = {"GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh, "RNN_RELU": torch._VF.rnn_relu}[mode]
    out, h = run(x, h0, weights, *common)
    return out.contiguous(), h.contiguous(), x.new_empty(0)


@recurrent.register_fake
def _(x, h0, c0, weights, mode, num_layers, bidirectional, batch_first):
    width = h0.shape[2] * (2 if bidirectional else 1)
    out = x.new_empty([x.shape[0], x.shape[1], width])
    return out, h0.new_empty(h0.shape), c0.new_empty(c0.shape) if c0 is not None else x.new_empty(0)


def unsupported(model) -> str | None:
    """Why a recurrent module of model cannot be a kloop::recurrent op (one line), or None."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.RNNBase):
            what = f"recurrent layer {name or 'the model'} ({type(module).__name__})"
            if module.mode not in MODES:
                return f"{what} has mode {module.mode}, which kloop's recurrent kernel does not compute"
            if getattr(module, "proj_size", 0):
                return f"{what} projects its hidden state (proj_size), which kloop's recurrent kernel does not compute"
            if module.dropout and module.training and module.num_layers > 1:
                return f"{what} drops out between layers at random, which no starter can match"
    return None


def _traced(original):
    """An nn.RNNBase forward as kloop::recurrent (batched tensor input; anything else goes to the original)."""
    def forward(self, input, hx=None):
        if not isinstance(input, torch.Tensor) or input.dim() != 3:
            return original(self, input, hx)
        directions = 2 if self.bidirectional else 1
        batch = input.shape[0 if self.batch_first else 1]
        if hx is None:
            zeros = input.new_zeros(self.num_layers * directions, batch, self.hidden_size)
            hx = (zeros, zeros) if self.mode == "LSTM" else zeros
        h0, c0 = hx if self.mode == "LSTM" else (hx, None)
        weights = [getattr(self, name) for name in self._flat_weights_names]
        out, h, c = torch.ops.kloop.recurrent(input, h0, c0, weights, self.mode, self.num_layers,
                                              self.bidirectional, self.batch_first)
        return (out, (h, c)) if self.mode == "LSTM" else (out, h)
    return forward


@contextlib.contextmanager
def traced_as_one_op():
    """While tracing: every nn.LSTM, nn.GRU and nn.RNN forward is kloop::recurrent."""
    with contextlib.ExitStack() as stack:
        for cls in (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN):
            stack.enter_context(mock.patch.object(cls, "forward", _traced(cls.forward)))
        yield


# -- the candidate's part (copied verbatim) ----------------------------------------------------------------------
@triton.jit
def _recurrent_dot(acc, h, w_ptr, w_rows, k, k_ok, col_ok, swr, swk, IEEE: tl.constexpr):
    w = tl.load(w_ptr + w_rows[None, :] * swr + k[:, None] * swk, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
    if IEEE:
        return acc + tl.dot(h, w, input_precision="tf32x3")
    return acc + tl.dot(h, w)


@triton.jit
def _recurrent_gates(h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk, GATES: tl.constexpr,
                     IEEE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # h_prev[rows, :] @ W_hh[g * H + cols, :]^T for each gate g of the tile, in one pass over h_prev (a gate past
    # GATES stays zero): the gates' weight loads are in flight together
    a0 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    a1 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    a2 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    a3 = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < H
        h = tl.load(h_ptr + rows[:, None] * shb + k[None, :] * shk, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a0 = _recurrent_dot(a0, h, w_ptr, cols, k, k_ok, col_ok, swr, swk, IEEE)
        if GATES > 1:
            a1 = _recurrent_dot(a1, h, w_ptr, H + cols, k, k_ok, col_ok, swr, swk, IEEE)
            a2 = _recurrent_dot(a2, h, w_ptr, 2 * H + cols, k, k_ok, col_ok, swr, swk, IEEE)
        if GATES > 3:
            a3 = _recurrent_dot(a3, h, w_ptr, 3 * H + cols, k, k_ok, col_ok, swr, swk, IEEE)
    return a0, a1, a2, a3


@triton.jit
def _recurrent_tile(xp_ptr, h_ptr, c_ptr, w_ptr, b_ptr, out_ptr, c_out_ptr, hn_ptr, rows, cols, B, H, FINAL,
                    sxb, shb, shk, scb, sck, swr, swk, sob, scob, snb,
                    MODE: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                    BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # One time step for the BLOCK_B x BLOCK_H tile (rows, cols) of (batch, hidden unit). xp: this step's input
    # projection (b_ih in it), gates side by side; MODE 0 LSTM (i, f, g, o), 1 GRU (r, z, n), 2 RNN tanh, 3 RNN ReLU.
    row_ok = rows < B
    col_ok = cols < H
    ok = row_ok[:, None] & col_ok[None, :]
    xp = xp_ptr + rows[:, None] * sxb + cols[None, :]
    a0, a1, a2, a3 = _recurrent_gates(h_ptr, w_ptr, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk,
                                      4 if MODE == 0 else 3 if MODE == 1 else 1, IEEE, BLOCK_B, BLOCK_H, BLOCK_K)
    a0 += tl.load(xp, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        a0 += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if MODE == 2:
        h = libdevice.tanh(a0)
    elif MODE == 3:
        h = tl.maximum(a0, 0.0)
    else:
        a1 += tl.load(xp + H, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(xp + 2 * H, mask=ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            a1 += tl.load(b_ptr + H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            a2 += tl.load(b_ptr + 2 * H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if MODE == 0:
            a3 += tl.load(xp + 3 * H, mask=ok, other=0.0).to(tl.float32)
            if HAS_BIAS:
                a3 += tl.load(b_ptr + 3 * H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            c_prev = tl.load(c_ptr + rows[:, None] * scb + cols[None, :] * sck, mask=ok, other=0.0).to(tl.float32)
            c = tl.sigmoid(a1) * c_prev + tl.sigmoid(a0) * libdevice.tanh(a2 + x2)
            tl.store(c_out_ptr + rows[:, None] * scob + cols[None, :], c.to(c_out_ptr.dtype.element_ty), mask=ok)
            h = tl.sigmoid(a3) * libdevice.tanh(c)
        else:   # GRU: n = tanh(x_n + r * (W_hn h + b_hn)), h = (1 - z) n + z h_prev
            h_prev = tl.load(h_ptr + rows[:, None] * shb + cols[None, :] * shk, mask=ok, other=0.0).to(tl.float32)
            n = libdevice.tanh(x2 + tl.sigmoid(a0) * a2)
            z = tl.sigmoid(a1)
            h = (1.0 - z) * n + z * h_prev
    h = h.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None] * sob + cols[None, :], h, mask=ok)
    if FINAL != 0:
        tl.store(hn_ptr + rows[:, None] * snb + cols[None, :], h, mask=ok)


@triton.jit
def _recurrent_step_kernel(xp_ptr, h_ptr, c_ptr, w_ptr, b_ptr, out_ptr, c_out_ptr, hn_ptr, B, H, FINAL,
                           sxb, shb, shk, scb, sck, swr, swk, sob, scob, snb,
                           MODE: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                           BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # One time step of one direction, a program per tile; the launches order the steps.
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    _recurrent_tile(xp_ptr, h_ptr, c_ptr, w_ptr, b_ptr, out_ptr, c_out_ptr, hn_ptr, rows, cols, B, H, FINAL,
                    sxb, shb, shk, scb, sck, swr, swk, sob, scob, snb, MODE, HAS_BIAS, IEEE, BLOCK_B, BLOCK_H, BLOCK_K)


@triton.jit
def _recurrent_layer_kernel(xp_ptr, h0_ptr, c0_ptr, w0_ptr, w1_ptr, b0_ptr, b1_ptr, out_ptr, hn_ptr, cn_ptr,
                            count_ptr, B, H, T, PROGRAMS, sxd, sxt, sxb, shd, shb, shk, scd, scb, sck, swr, swk,
                            sot, sob, snd, snb, sfd, sfb,
                            MODE: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                            BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # Every time step of one layer, both directions at once (axis 1): PROGRAMS programs per direction share its
    # tiles and meet at a barrier after each step (a counter per direction), so they must all be resident at once
    # (the launcher keeps the grid within the GPU's multiprocessors). The running cell state lives in c_n.
    d = tl.program_id(1)
    if d == 0:
        w_ptr = w0_ptr
        b_ptr = b0_ptr
    else:
        w_ptr = w1_ptr
        b_ptr = b1_ptr
    count = count_ptr + d
    tiles_h = tl.cdiv(H, BLOCK_H)
    tiles = tl.cdiv(B, BLOCK_B) * tiles_h
    for s in range(0, T):
        t = s + d * (T - 1 - 2 * s)   # the backward direction runs from the last step to the first
        t_prev = t - 1 + 2 * d
        if s == 0:
            h_ptr = h0_ptr + d * shd
            h_sb = shb
            h_sk = shk
            c_ptr = c0_ptr + d * scd
            c_sb = scb
            c_sk = sck
        else:
            h_ptr = out_ptr + t_prev * sot + d * H
            h_sb = sob
            h_sk = 1
            c_ptr = cn_ptr + d * sfd
            c_sb = sfb
            c_sk = 1
        for tile in range(tl.program_id(0), tiles, PROGRAMS):
            rows = (tile // tiles_h) * BLOCK_B + tl.arange(0, BLOCK_B)
            cols = (tile % tiles_h) * BLOCK_H + tl.arange(0, BLOCK_H)
            _recurrent_tile(xp_ptr + d * sxd + t * sxt, h_ptr, c_ptr, w_ptr, b_ptr, out_ptr + t * sot + d * H,
                            cn_ptr + d * sfd, hn_ptr + d * snd, rows, cols, B, H, s == T - 1, sxb, h_sb, h_sk,
                            c_sb, c_sk, swr, swk, sob, sfb, snb, MODE, HAS_BIAS, IEEE, BLOCK_B, BLOCK_H, BLOCK_K)
        # The step's barrier, as a cooperative grid sync: every thread's stores before one thread's release; its
        # acquire and the CTA barrier order every thread's next loads after the other programs' stores (PTX's
        # memory model: the barrier makes the release and the acquire cumulative over the CTA's threads).
        tl.debug_barrier()
        tl.atomic_add(count, 1, sem="release")
        arrived = tl.atomic_add(count, 0, sem="acquire")
        while arrived < (s + 1) * PROGRAMS:
            arrived = tl.atomic_add(count, 0, sem="acquire")
        # Triton hands the atomic's value to every warp through shared memory that the next step's pipelined loads
        # reuse, and its sm_90 PTX has no CTA barrier between: without this one a warp could read a tile's bits as
        # the count
        tl.debug_barrier()


def _recurrent(x, h0, c0, weights, mode, num_layers, bidirectional, batch_first):
    """(output, h_n, c_n) of nn.LSTM / GRU / RNN (c_n empty but for LSTM) from kloop's Triton kernels."""
    directions = 2 if bidirectional else 1
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    per_direction = len(weights) // (num_layers * directions)   # W_ih, W_hh[, b_ih, b_hh]
    hidden = h0.shape[2]
    batch, steps = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    h_n = torch.empty(h0.shape, dtype=x.dtype, device=x.device)
    c_n = torch.empty(c0.shape if mode == "LSTM" else [0], dtype=x.dtype, device=x.device)
    if RNN_PERSISTENT and len({(w.shape, w.stride()) for w in weights[1::per_direction]}) == 1:
        return _recurrent_layers(x, h0, c0, weights, mode, num_layers, directions, batch_first, h_n, c_n)
    c_work = torch.empty([2, batch, hidden], dtype=x.dtype, device=x.device)   # the cell state between steps

    def at(t_major, t):   # time step t of a (T, B, ...) or batch_first (B, T, ...) tensor
        return t_major[:, t] if batch_first else t_major[t]

    layer_in = x
    grid = ((batch + RNN_BLOCK_B - 1) // RNN_BLOCK_B, (hidden + RNN_BLOCK_H - 1) // RNN_BLOCK_H)
    for layer in range(num_layers):
        out = torch.empty([x.shape[0], x.shape[1], directions * hidden], dtype=x.dtype, device=x.device)
        for d in range(directions):
            index = layer * directions + d
            w_ih, w_hh = weights[index * per_direction], weights[index * per_direction + 1]
            b_ih = weights[index * per_direction + 2] if per_direction == 4 else None
            b_hh = weights[index * per_direction + 3] if per_direction == 4 else None
            projected = _input_projection(layer_in, w_ih, b_ih, gates * hidden)
            own = out[:, :, d * hidden:(d + 1) * hidden]
            for s in range(steps):
                t = s if d == 0 else steps - 1 - s
                h_prev = h0[index] if s == 0 else at(own, t - 1 if d == 0 else t + 1)
                c_prev = (c0[index] if s == 0 else c_work[(s - 1) % 2]) if mode == "LSTM" else h_prev
                c_next = (c_n[index] if s == steps - 1 else c_work[s % 2]) if mode == "LSTM" else h_prev
                xp, h_out = at(projected, t), at(own, t)
                _recurrent_step_kernel[grid](
                    xp, h_prev, c_prev, w_hh, b_hh if b_hh is not None else w_hh, h_out, c_next, h_n[index],
                    batch, hidden, int(s == steps - 1), xp.stride(0), h_prev.stride(0), h_prev.stride(1),
                    c_prev.stride(0), c_prev.stride(1), w_hh.stride(0), w_hh.stride(1), h_out.stride(0),
                    c_next.stride(0), h_n.stride(1), MODE=MODES[mode], HAS_BIAS=b_hh is not None,
                    IEEE=x.dtype == torch.float32, BLOCK_B=RNN_BLOCK_B, BLOCK_H=RNN_BLOCK_H, BLOCK_K=RNN_BLOCK_K,
                    num_warps=RNN_NUM_WARPS)
        layer_in = out
    return layer_in, h_n, c_n


def _recurrent_layers(x, h0, c0, weights, mode, num_layers, directions, batch_first, h_n, c_n):
    """_recurrent with one launch of _recurrent_layer_kernel per layer (after its input projections)."""
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    per_direction = len(weights) // (num_layers * directions)
    batch, hidden = h0.shape[1], h0.shape[2]
    steps = x.shape[1] if batch_first else x.shape[0]
    tiles = ((batch + RNN_BLOCK_B - 1) // RNN_BLOCK_B) * ((hidden + RNN_BLOCK_H - 1) // RNN_BLOCK_H)
    # Every program of a launch waits for the others at each step, so all must be resident: at most one a
    # multiprocessor. Under the CPU interpreter programs run one after another: one a direction does every tile.
    resident = torch.cuda.get_device_properties(x.device).multi_processor_count // directions if x.is_cuda else 1
    programs = max(1, min(tiles, resident))
    counts = torch.zeros([num_layers, 2], dtype=torch.int32, device=x.device)
    cell = c_n if mode == "LSTM" else h_n          # the running cell state (an LSTM's), in place
    c_start = c0 if mode == "LSTM" else h0
    layer_in = x
    for layer in range(num_layers):
        out = torch.empty([x.shape[0], x.shape[1], directions * hidden], dtype=x.dtype, device=x.device)
        first = layer * directions
        own = [weights[(first + d) * per_direction:(first + d + 1) * per_direction] for d in range(directions)]
        projected = torch.empty([directions, x.shape[0], x.shape[1], gates * hidden], dtype=x.dtype, device=x.device)
        for d in range(directions):
            _input_projection(layer_in, own[d][0], own[d][2] if per_direction == 4 else None, gates * hidden,
                              projected[d])
        w_hh = [own[d][1] for d in range(directions)] * (3 - directions)    # direction 1's is direction 0's
        b_hh = [own[d][3] if per_direction == 4 else own[d][1] for d in range(directions)] * (3 - directions)
        (sxt, sxb), (sot, sob) = _time_and_batch_strides(projected[0], batch_first), \
            _time_and_batch_strides(out, batch_first)
        _recurrent_layer_kernel[(programs, directions)](
            projected, h0[first], c_start[first], w_hh[0], w_hh[1], b_hh[0], b_hh[1], out, h_n[first], cell[first],
            counts[layer], batch, hidden, steps, programs, projected.stride(0), sxt, sxb,
            h0.stride(0), h0.stride(1), h0.stride(2), c_start.stride(0), c_start.stride(1), c_start.stride(2),
            w_hh[0].stride(0), w_hh[0].stride(1), sot, sob, h_n.stride(0), h_n.stride(1), cell.stride(0),
            cell.stride(1), MODE=MODES[mode], HAS_BIAS=per_direction == 4, IEEE=x.dtype == torch.float32,
            BLOCK_B=RNN_BLOCK_B, BLOCK_H=RNN_BLOCK_H, BLOCK_K=RNN_BLOCK_K, num_warps=RNN_NUM_WARPS)
        layer_in = out
    return layer_in, h_n, c_n


def _time_and_batch_strides(t, batch_first):
    """A (T, B, ...) or batch_first (B, T, ...) tensor's strides of a time step and of a batch row."""
    return (t.stride(1), t.stride(0)) if batch_first else (t.stride(0), t.stride(1))


def _input_projection(layer_in, w_ih, b_ih, width, projected=None):
    """Every step's input projection at once, x W_ih^T + b_ih: one GEMM over the rows of layer_in, in its layout."""
    if projected is None:
        projected = torch.empty([layer_in.shape[0], layer_in.shape[1], width], dtype=layer_in.dtype,
                                device=layer_in.device)
    rows = _merged_rows(layer_in)
    _gemm(rows, w_ih.t().unsqueeze(0).expand(rows.shape[0], -1, -1), b_ih,
          projected.view(rows.shape[0], rows.shape[1], width), 1.0, 1.0)
    return projected


def _merged_rows(t):
    """A 3-D tensor as (batches, rows, features) for one GEMM: its two leading dimensions as one batch of rows where
    their strides allow (a contiguous input: one GEMM of T x B rows), else batched over the first."""
    if t.stride(0) == t.shape[1] * t.stride(1):
        return t.as_strided([1, t.shape[0] * t.shape[1], t.shape[2]], [0, t.stride(1), t.stride(2)])
    return t


def candidate_source(call: str) -> str:
    """The kernels and launcher as a candidate holds them, whatever `call` (a translated wrapper) launches (with
    kloop's GEMM: inductor_gemm.candidate_source)."""
    functions = (_recurrent_dot.fn, _recurrent_gates.fn, _recurrent_tile.fn, _recurrent_step_kernel.fn,
                 _recurrent_layer_kernel.fn, _recurrent, _recurrent_layers, _time_and_batch_strides,
                 _input_projection, _merged_rows)
    return f"MODES = {MODES!r}\n\n\n" + "\n\n".join(inspect.getsource(f) for f in functions)
