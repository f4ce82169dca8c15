"""RNN, GRU and LSTM, unrolled over a static sequence length.

ONNX's layouts, gate orders (GRU ``zrh``, LSTM ``iofc``), directions
(forward, reverse, bidirectional), activations with their alpha/beta, ``clip``,
LSTM peepholes and ``input_forget``, GRU ``linear_before_reset``, initial
states, and ``sequence_lens`` (forward direction) follow the specification.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from tvm import relax

from forge_onnx.converters import ConverterContext
from forge_onnx.converters.shapes import static_shape

Activation = Callable[[relax.Expr], relax.Expr]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _activation(name: str, alpha: float | None, beta: float | None, dtype: str) -> Activation:
    c = lambda v: relax.const(float(v), dtype)  # noqa: E731
    name = name.lower()
    if name == "sigmoid":
        return relax.op.sigmoid
    if name == "tanh":
        return relax.op.tanh
    if name == "relu":
        return relax.op.nn.relu
    if name == "hardsigmoid":
        a, b = (0.2 if alpha is None else alpha), (0.5 if beta is None else beta)
        return lambda x: relax.op.clip(relax.op.add(relax.op.multiply(c(a), x), c(b)), 0.0, 1.0)
    if name == "leakyrelu":
        return lambda x: relax.op.nn.leakyrelu(x, 0.01 if alpha is None else alpha)
    if name == "affine":
        return lambda x: relax.op.add(relax.op.multiply(c(alpha or 1.0), x), c(beta or 0.0))
    if name == "scaledtanh":
        return lambda x: relax.op.multiply(c(alpha or 1.0), relax.op.tanh(relax.op.multiply(c(beta or 1.0), x)))
    if name == "softsign":
        return lambda x: relax.op.divide(x, relax.op.add(c(1.0), relax.op.abs(x)))
    if name == "softplus":
        return lambda x: relax.op.log(relax.op.add(c(1.0), relax.op.exp(x)))
    if name == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: relax.op.where(relax.op.greater(x, c(0)), x,
                                        relax.op.multiply(c(a), relax.op.subtract(relax.op.exp(x), c(1.0))))
    raise ValueError(f"unsupported recurrent activation {name!r}")


def _activations(attrs: dict[str, Any], defaults: list[str], directions: int, dtype: str) -> list[list[Activation]]:
    names = [_text(n) for n in attrs.get("activations", [])] or defaults * directions
    alphas = list(attrs.get("activation_alpha", [])) + [None] * len(names)
    betas = list(attrs.get("activation_beta", [])) + [None] * len(names)
    functions = [_activation(n, a, b, dtype) for n, a, b in zip(names, alphas, betas)]
    per = len(defaults)
    return [functions[d * per:(d + 1) * per] for d in range(directions)]


def _index(bb: relax.BlockBuilder, x: relax.Expr, i: int, axis: int = 0) -> relax.Expr:
    return bb.emit(relax.op.squeeze(relax.op.strided_slice(x, axes=[axis], begin=[i], end=[i + 1]), axis=[axis]))


def _split(bb: relax.BlockBuilder, x: relax.Expr, parts: int) -> list[relax.Expr]:
    pieces = bb.emit(relax.op.split(x, parts, axis=-1))
    return [bb.emit(relax.TupleGetItem(pieces, i)) for i in range(parts)]


class _Setup:
    """What every recurrent operator reads the same way."""

    def __init__(self, bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], gates: int) -> None:
        self.bb = bb
        x, w, r = inputs[0], inputs[1], inputs[2]
        self.dtype = str(x.ty.dtype)
        self.layout = int(attrs.get("layout", 0))
        if self.layout == 1:
            x = bb.emit(relax.op.permute_dims(x, [1, 0, 2]))
        shape = static_shape(x)
        if shape is None:
            raise ValueError("recurrent operators need a static input shape")
        self.seq, self.batch, _ = shape
        self.hidden = int(attrs["hidden_size"]) if "hidden_size" in attrs else static_shape(r)[-1]
        self.direction = _text(attrs.get("direction", "forward"))
        self.directions = 2 if self.direction == "bidirectional" else 1
        self.clip = attrs.get("clip")
        self.x, self.w, self.r, self.gates = x, w, r, gates
        self.bias = inputs[3] if len(inputs) > 3 else None
        self.lengths = inputs[4] if len(inputs) > 4 else None
        self.initial = [inputs[i] if len(inputs) > i else None for i in (5, 6)]
        if self.lengths is not None and self.direction != "forward":
            raise ValueError("sequence_lens is supported for the forward direction only")

    def const(self, value: float) -> relax.Expr:
        return relax.const(value, self.dtype)

    def clipped(self, x: relax.Expr) -> relax.Expr:
        if self.clip is None:
            return x
        return relax.op.clip(x, -float(self.clip), float(self.clip))

    def projections(self, d: int) -> tuple[relax.Expr, relax.Expr, relax.Expr | None]:
        """X W^T (+ Wb) for every step at once, R^T, and Rb."""
        bb = self.bb
        w, r = _index(bb, self.w, d), _index(bb, self.r, d)
        xw = bb.emit(relax.op.matmul(self.x, relax.op.permute_dims(w, [1, 0])))
        rb = None
        if self.bias is not None:
            both = _split(bb, _index(bb, self.bias, d), 2)
            xw = bb.emit(relax.op.add(xw, both[0]))
            rb = both[1]
        return xw, bb.emit(relax.op.permute_dims(r, [1, 0])), rb

    def initial_state(self, which: int, d: int) -> relax.Expr:
        given = self.initial[which]
        if given is None:
            return relax.const(np.zeros((self.batch, self.hidden), dtype=self.dtype), self.dtype)
        state = given if self.layout == 0 else self.bb.emit(relax.op.permute_dims(given, [1, 0, 2]))
        return _index(self.bb, state, d)

    def steps(self, d: int) -> list[int]:
        forward = d == 0 and self.direction != "reverse"
        return list(range(self.seq)) if forward else list(range(self.seq - 1, -1, -1))

    def keep(self, t: int, new: relax.Expr, old: relax.Expr) -> relax.Expr:
        """With sequence_lens: the state stops updating after each entry's length."""
        if self.lengths is None:
            return new
        alive = self.bb.emit(relax.op.less(relax.const(t, "int32"), relax.op.reshape(
            relax.op.astype(self.lengths, "int32"), [self.batch, 1])))
        return self.bb.emit(relax.op.where(alive, new, old))

    def output_step(self, t: int, h: relax.Expr) -> relax.Expr:
        if self.lengths is None:
            return h
        alive = self.bb.emit(relax.op.less(relax.const(t, "int32"), relax.op.reshape(
            relax.op.astype(self.lengths, "int32"), [self.batch, 1])))
        return self.bb.emit(relax.op.where(alive, h, relax.op.zeros_like(h)))

    def assemble(self, outputs: list[list[relax.Expr]], finals: list[list[relax.Expr]]) -> relax.Expr:
        """Y [seq, dirs, batch, hidden] (layout 0) and the final states [dirs, batch, hidden]."""
        bb = self.bb
        per_direction = [bb.emit(relax.op.stack(steps, axis=0)) for steps in outputs]
        y = bb.emit(relax.op.stack(per_direction, axis=1))
        states = [bb.emit(relax.op.stack(list(state), axis=0)) for state in zip(*finals)]
        if self.layout == 1:
            y = bb.emit(relax.op.permute_dims(y, [2, 0, 1, 3]))
            states = [bb.emit(relax.op.permute_dims(s, [1, 0, 2])) for s in states]
        return relax.Tuple([y, *states])


def rnn(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """RNN: H_t = f(X_t W^T + H_(t-1) R^T + Wb + Rb)."""
    s = _Setup(bb, inputs, attrs, 1)
    activations = _activations(attrs, ["Tanh"], s.directions, s.dtype)
    outputs, finals = [], []
    for d in range(s.directions):
        xw, rt, rb = s.projections(d)
        h = s.initial_state(0, d)
        (f,) = activations[d]
        steps: dict[int, relax.Expr] = {}
        for t in s.steps(d):
            pre = bb.emit(relax.op.add(_index(bb, xw, t), relax.op.matmul(h, rt)))
            if rb is not None:
                pre = bb.emit(relax.op.add(pre, rb))
            h = s.keep(t, bb.emit(f(s.clipped(pre))), h)
            steps[t] = s.output_step(t, h)
        outputs.append([steps[t] for t in range(s.seq)])
        finals.append([h])
    return s.assemble(outputs, finals)


def gru(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """GRU with gates z, r, h; ``linear_before_reset`` as specified."""
    s = _Setup(bb, inputs, attrs, 3)
    activations = _activations(attrs, ["Sigmoid", "Tanh"], s.directions, s.dtype)
    before_reset = bool(attrs.get("linear_before_reset", 0))
    outputs, finals = [], []
    for d in range(s.directions):
        xw, rt, rb = s.projections(d)
        xz_xr_xh = xw
        rts = _split(bb, rt, 3)  # R^T is [hidden, 3*hidden]: columns z, r, h
        rbs = _split(bb, rb, 3) if rb is not None else [None, None, None]
        f, g = activations[d]
        h = s.initial_state(0, d)
        steps: dict[int, relax.Expr] = {}
        for t in s.steps(d):
            xz, xr, xh = _split(bb, _index(bb, xz_xr_xh, t), 3)

            def recurrent(i: int, state: relax.Expr) -> relax.Expr:
                term = bb.emit(relax.op.matmul(state, rts[i]))
                return term if rbs[i] is None else bb.emit(relax.op.add(term, rbs[i]))

            z = bb.emit(f(s.clipped(relax.op.add(xz, recurrent(0, h)))))
            r = bb.emit(f(s.clipped(relax.op.add(xr, recurrent(1, h)))))
            if before_reset:
                candidate = relax.op.add(xh, relax.op.multiply(r, recurrent(2, h)))
            else:
                candidate = relax.op.add(xh, recurrent(2, bb.emit(relax.op.multiply(r, h))))
            n = bb.emit(g(s.clipped(candidate)))
            new = bb.emit(relax.op.add(relax.op.multiply(relax.op.subtract(s.const(1.0), z), n),
                                       relax.op.multiply(z, h)))
            h = s.keep(t, new, h)
            steps[t] = s.output_step(t, h)
        outputs.append([steps[t] for t in range(s.seq)])
        finals.append([h])
    return s.assemble(outputs, finals)


def lstm(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any], context: ConverterContext) -> relax.Expr:
    """LSTM with gates i, o, f, c; peepholes and ``input_forget`` as specified."""
    s = _Setup(bb, inputs, attrs, 4)
    activations = _activations(attrs, ["Sigmoid", "Tanh", "Tanh"], s.directions, s.dtype)
    peepholes = inputs[7] if len(inputs) > 7 else None
    couple = bool(attrs.get("input_forget", 0))
    outputs, finals = [], []
    for d in range(s.directions):
        xw, rt, rb = s.projections(d)
        f, g, h_act = activations[d]
        h, c = s.initial_state(0, d), s.initial_state(1, d)
        p = _split(bb, _index(bb, peepholes, d), 3) if peepholes is not None else None
        steps: dict[int, relax.Expr] = {}
        for t in s.steps(d):
            pre = bb.emit(relax.op.add(_index(bb, xw, t), relax.op.matmul(h, rt)))
            if rb is not None:
                pre = bb.emit(relax.op.add(pre, rb))
            pi, po, pf, pc = _split(bb, pre, 4)
            if p is not None:
                pi = relax.op.add(pi, relax.op.multiply(p[0], c))
                pf = relax.op.add(pf, relax.op.multiply(p[2], c))
            i_gate = bb.emit(f(s.clipped(pi)))
            f_gate = bb.emit(relax.op.subtract(s.const(1.0), i_gate)) if couple else bb.emit(f(s.clipped(pf)))
            candidate = bb.emit(g(s.clipped(pc)))
            new_c = bb.emit(relax.op.add(relax.op.multiply(f_gate, c), relax.op.multiply(i_gate, candidate)))
            if p is not None:
                po = relax.op.add(po, relax.op.multiply(p[1], new_c))
            o_gate = bb.emit(f(s.clipped(po)))
            new_h = bb.emit(relax.op.multiply(o_gate, h_act(new_c)))
            c = s.keep(t, new_c, c)
            h = s.keep(t, new_h, h)
            steps[t] = s.output_step(t, h)
        outputs.append([steps[t] for t in range(s.seq)])
        finals.append([h, c])
    return s.assemble(outputs, finals)


CONVERTERS = {"RNN": rnn, "GRU": gru, "LSTM": lstm}
