"""kloop's Triton recurrent layers: what an Inductor starter computes nn.LSTM, nn.GRU and nn.RNN with.

torch.compile makes no graph of a recurrent layer (Dynamo leaves `_VF.lstm` to PyTorch, which calls cuDNN), so the
starter generator (agent/kernels/inductor.py) traces each such module's forward as one opaque op,
`kloop::recurrent` (this module's `recurrent`, with symbolic output shapes), and Inductor generates Triton for
everything around it; the candidate computes the op with `_recurrent` below, whose source is copied into it verbatim
(`candidate_source`), its tunables as `RNN_*` constants.

Per layer and direction: the input projection of every time step at once, x W_ih^T + b_ih, as one GEMM (kloop's
own, agent/kernels/inductor_gemm.py); then one launch per time step of `_recurrent_step_kernel`, which multiplies
the previous hidden state by W_hh for each gate of its tile (3xTF32 dot products over fp32, as the GEMM) and applies
the gates: LSTM's i, f, g, o with its cell state, GRU's r, z, n, or the plain RNN's tanh or ReLU. A step writes its
hidden state into the layer's output sequence, where the next step reads it (the launches order the steps); the last
step also writes h_n (and c_n). Sizes are runtime arguments, so one compiled kernel serves every shape.
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

MODES = {"LSTM": 0, "GRU": 1, "RNN_TANH": 2, "RNN_RELU": 3}
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
TUNABLES = {"RNN_BLOCK_B": [16, 32, 64], "RNN_BLOCK_H": [16, 32, 64, 128], "RNN_BLOCK_K": [16, 32, 64],
            "RNN_NUM_WARPS": [1, 2, 4, 8]}
DEFAULTS = {"RNN_BLOCK_B": RNN_BLOCK_B, "RNN_BLOCK_H": RNN_BLOCK_H, "RNN_BLOCK_K": RNN_BLOCK_K,
            "RNN_NUM_WARPS": RNN_NUM_WARPS}
# Settings timed beside the defaults on a GPU (agent/kernels/starter_tune.py): more programs per step (narrow
# tiles) against fewer, deeper ones
CONFIGS = [{"RNN_BLOCK_B": b, "RNN_BLOCK_H": h, "RNN_BLOCK_K": k, "RNN_NUM_WARPS": w}
           for b, h, k, w in [(16, 16, 64, 2), (16, 64, 32, 4), (32, 32, 32, 4), (16, 128, 32, 8)]]
# Under the CPU interpreter every program is Python over numpy tiles: few, large programs.
INTERPRETER_DEFAULTS = {**DEFAULTS, "RNN_BLOCK_B": 64, "RNN_BLOCK_H": 128, "RNN_BLOCK_K": 64}
NOTE = ("its recurrent layers run kloop's Triton recurrence (_recurrent: each step's gates in one launch of "
        "_recurrent_step_kernel, the input projections as one GEMM per layer), tuned by the RNN_* constants")


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
def _recurrent_gate(h_ptr, w_ptr, gate, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk,
                    IEEE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # h_prev[rows, :] @ W_hh[gate * H + cols, :]^T: one gate's recurrent product for the tile
    acc = tl.zeros((BLOCK_B, BLOCK_H), dtype=tl.float32)
    w_rows = gate * H + cols
    for k0 in range(0, H, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < H
        h = tl.load(h_ptr + rows[:, None] * shb + k[None, :] * shk, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + w_rows[None, :] * swr + k[:, None] * swk, mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)
        if IEEE:
            acc += tl.dot(h, w, input_precision="tf32x3")
        else:
            acc += tl.dot(h, w)
    return acc


@triton.jit
def _recurrent_step_kernel(xp_ptr, h_ptr, c_ptr, w_ptr, b_ptr, out_ptr, c_out_ptr, hn_ptr, B, H, FINAL,
                           sxb, shb, shk, scb, sck, swr, swk, sob, scob, snb,
                           MODE: tl.constexpr, HAS_BIAS: tl.constexpr, IEEE: tl.constexpr,
                           BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    # One time step for a BLOCK_B x BLOCK_H tile of (batch, hidden unit). xp: this step's input projection (b_ih in
    # it), gates side by side; MODE 0 LSTM (i, f, g, o), 1 GRU (r, z, n), 2 RNN tanh, 3 RNN ReLU.
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    row_ok = rows < B
    col_ok = cols < H
    ok = row_ok[:, None] & col_ok[None, :]
    xp = xp_ptr + rows[:, None] * sxb + cols[None, :]
    a0 = _recurrent_gate(h_ptr, w_ptr, 0, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk,
                         IEEE, BLOCK_B, BLOCK_H, BLOCK_K)
    a0 += tl.load(xp, mask=ok, other=0.0).to(tl.float32)
    if HAS_BIAS:
        a0 += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if MODE == 2:
        h = libdevice.tanh(a0)
    elif MODE == 3:
        h = tl.maximum(a0, 0.0)
    else:
        a1 = _recurrent_gate(h_ptr, w_ptr, 1, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk,
                             IEEE, BLOCK_B, BLOCK_H, BLOCK_K)
        a1 += tl.load(xp + H, mask=ok, other=0.0).to(tl.float32)
        a2 = _recurrent_gate(h_ptr, w_ptr, 2, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk,
                             IEEE, BLOCK_B, BLOCK_H, BLOCK_K)
        x2 = tl.load(xp + 2 * H, mask=ok, other=0.0).to(tl.float32)
        if HAS_BIAS:
            a1 += tl.load(b_ptr + H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
            a2 += tl.load(b_ptr + 2 * H + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if MODE == 0:
            a3 = _recurrent_gate(h_ptr, w_ptr, 3, rows, cols, row_ok, col_ok, H, shb, shk, swr, swk,
                                 IEEE, BLOCK_B, BLOCK_H, BLOCK_K)
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


def _recurrent(x, h0, c0, weights, mode, num_layers, bidirectional, batch_first):
    """(output, h_n, c_n) of nn.LSTM / GRU / RNN (c_n empty but for LSTM) from kloop's Triton kernels."""
    directions = 2 if bidirectional else 1
    gates = {"LSTM": 4, "GRU": 3}.get(mode, 1)
    per_direction = len(weights) // (num_layers * directions)   # W_ih, W_hh[, b_ih, b_hh]
    hidden = h0.shape[2]
    batch, steps = (x.shape[0], x.shape[1]) if batch_first else (x.shape[1], x.shape[0])
    h_n = torch.empty(h0.shape, dtype=x.dtype, device=x.device)
    c_n = torch.empty(c0.shape if mode == "LSTM" else [0], dtype=x.dtype, device=x.device)
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
            # every step's input projection at once: one GEMM over the rows of layer_in, in its own layout
            projected = torch.empty([x.shape[0], x.shape[1], gates * hidden], dtype=x.dtype, device=x.device)
            rows = _merged_rows(layer_in)
            _gemm(rows, w_ih.t().unsqueeze(0).expand(rows.shape[0], -1, -1), b_ih,
                  projected.view(rows.shape[0], rows.shape[1], gates * hidden), 1.0, 1.0)
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


def _merged_rows(t):
    """A 3-D tensor as (batches, rows, features) for one GEMM: its two leading dimensions as one batch of rows where
    their strides allow (a contiguous input: one GEMM of T x B rows), else batched over the first."""
    if t.stride(0) == t.shape[1] * t.stride(1):
        return t.as_strided([1, t.shape[0] * t.shape[1], t.shape[2]], [0, t.stride(1), t.stride(2)])
    return t


def candidate_source(call: str) -> str:
    """The kernels and launcher as a candidate holds them, whatever `call` (a translated wrapper) launches (with
    kloop's GEMM: inductor_gemm.candidate_source)."""
    functions = (_recurrent_gate.fn, _recurrent_step_kernel.fn, _recurrent, _merged_rows)
    return f"MODES = {MODES!r}\n\n\n" + "\n\n".join(inspect.getsource(f) for f in functions)
