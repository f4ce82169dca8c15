"""One PrimFunc that runs a whole RNN, GRU or LSTM sequence: every time step, every direction.

The input projection ``X W^T + biases`` of every step is one matrix product
before the kernel (see ``recurrent.py``); the kernel does the rest. Per step
and per direction it computes ``H_(t-1) R^T`` tile by tile, 16 hidden units at
a time (all gates of those units together), applies the gate nonlinearities
and the state update to the tile while it is in registers, and writes the
step's output. Hidden units are padded to a multiple of :data:`LANES` inside
the kernel; the outputs have the true size.

Layouts (``T = ceil(hidden / LANES)`` tiles, ``G`` gates in ONNX's order, ``V = LANES``):

* ``xw``: ``[seq, batch, dirs, T, G, V]``, the projection with its biases;
* ``r``: ``[dirs, T, hidden, G, V]``, ``R^T`` with the columns of a tile together;
* ``rbh`` (GRU with ``linear_before_reset``): ``[dirs, T, V]``, the recurrent bias of gate h;
* ``p`` (LSTM peepholes): ``[dirs, 3, T, V]``, gates i, o, f;
* ``lengths``: ``[batch]`` int32; ``h0``, ``c0``: ``[dirs, batch, hidden]``;
* outputs ``y`` ``[seq, dirs, batch, hidden]``, ``y_h`` and (LSTM) ``y_c`` ``[dirs, batch, hidden]``.

A quantized cell (onnxruntime's ``DynamicQuantizeLSTM``) quantizes each
direction's state to uint8 at every step, as onnxruntime's kernel does (each
block of tiles finds the state's range itself), and sums ``H R^T`` exactly
against the integer weights before scaling it back.

With enough work per step the tiles of a step are shared among the threads of
one parallel region that lasts the whole sequence: a barrier ends each step
(two for GRU without ``linear_before_reset``, whose candidate gate needs the
reset gate of every unit), and the hidden state is double-buffered so that a
step never overwrites what another thread still reads.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tvm import tirx
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from forge_core.errors import ModelImportError, OptionError
from forge_core.schedules.apply import RULE_ATTR, SCHEDULED_ATTR
from forge_onnx.kernel_attrs import RECURRENT_CELL_ATTR
from forge_onnx.converters.recurrent_math import Activation

RULE_NAME = "RecurrentKernel"
"""How the compile log's schedule summary names these kernels."""
LANES = 16
"""Hidden units per tile: one AVX-512 register of float32 (two AVX2 ones, four NEON ones)."""
GATES = {"rnn": 1, "gru": 3, "lstm": 4}
ACCUMULATORS = 8
"""Vector accumulators a block of tiles keeps in the recurrent product (8 of AVX-512's 32 registers)."""
PARALLEL_MIN_WORK = 1 << 19
"""Multiply-adds per step from which a step's tiles are shared among threads: about where the recurrent weights
outgrow one core's L2 (LSTM hidden 362). Measured on this project's shared 2-core machine, a barrier per step cost
more than it saved below that, and often above it too when the other core was busy."""


@dataclass(frozen=True)
class RecurrentCell:
    """What one recurrent kernel computes."""

    kind: str
    """``"rnn"``, ``"gru"`` or ``"lstm"``."""
    seq: int | None
    """Time steps; None when dynamic (the kernel takes them from its input's shape)."""
    batch: int | None
    """Batch rows; None when dynamic."""
    hidden: int
    reverse: tuple[bool, ...]
    """Per direction, whether it runs from the last step to the first: ``(False, True)`` is bidirectional."""
    activations: tuple[tuple[Activation, ...], ...]
    """Per direction: RNN ``(f,)``, GRU ``(f, g)``, LSTM ``(f, g, h)``."""
    clip: float | None = None
    linear_before_reset: bool = False
    input_forget: bool = False
    peepholes: bool = False
    lengths: bool = False
    initial_h: bool = False
    initial_c: bool = False
    dtype: str = "float32"
    """``"float32"`` (vectorizable exp/tanh, see ``recurrent_math``) or ``"float64"`` (the C library's)."""
    quantized: str | None = None
    """onnxruntime's ``DynamicQuantizeLSTM``: at every step each direction's hidden state (all batch rows that are
    still running) is quantized to uint8 with the scale and zero point of its range, and ``H R^T`` is a sum of
    integer products, scaled back (``r`` holds the int8 weights less their zero point, ``r_scale`` their scales).
    The type of ``r`` and of the sums: ``"int32"``, or ``"float32"`` where every sum stays below 2**24, so that
    float32 holds it exactly (multiply-adds of the vector unit). float32 LSTM only."""

    def __post_init__(self) -> None:
        if self.kind not in GATES:
            raise OptionError(f"unknown recurrent cell {self.kind!r}")
        if self.dtype not in ("float32", "float64"):
            raise OptionError(f"recurrent kernels compute in float32 or float64, not {self.dtype}")
        if self.quantized not in (None, "int32", "float32"):
            raise OptionError(f"a quantized recurrent kernel sums in int32 or float32, not {self.quantized}")
        if self.quantized and (self.kind != "lstm" or self.dtype != "float32"):
            raise OptionError(f"a quantized recurrent kernel is a float32 LSTM, not {self.dtype} {self.kind}")
        if len(self.activations) != self.directions:
            raise OptionError("one tuple of activations per direction")
        if not self.static:
            return  # the kernel checks its sizes when it runs
        largest = max(max(math.prod(s) for s in self.input_shapes), math.prod(self.output_shapes[0]))
        if largest >= 1 << 31:
            raise ModelImportError(f"recurrent tensors of {largest} elements exceed the kernel's 32-bit indexing")

    def const(self, value: float) -> Any:
        return tirx.const(value, self.dtype)

    @property
    def gates(self) -> int:
        return GATES[self.kind]

    @property
    def directions(self) -> int:
        return len(self.reverse)

    @property
    def tiles(self) -> int:
        return -(-self.hidden // LANES)

    @property
    def padded(self) -> int:
        return self.tiles * LANES

    @property
    def static(self) -> bool:
        """Whether the sequence length and the batch are known when the kernel is built."""
        return self.seq is not None and self.batch is not None

    @property
    def work(self) -> int:
        """Multiply-adds of one step's recurrent products (for one batch row when the batch is dynamic)."""
        return self.directions * (self.batch or 1) * self.gates * self.padded * self.hidden

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RecurrentCell:
        fields = json.loads(text)
        fields["reverse"] = tuple(fields["reverse"])
        fields["activations"] = tuple(tuple(Activation(**a) for a in acts) for acts in fields["activations"])
        return cls(**fields)

    @property
    def input_shapes(self) -> list[tuple[Any, ...]]:
        """Shapes of the kernel's inputs in order (all of the cell's type but ``lengths``, int32, and a quantized
        cell's ``r``, of :attr:`quantized`); None for a dynamic dim."""
        return self.input_shapes_for(self.seq, self.batch)

    @property
    def output_shapes(self) -> list[tuple[Any, ...]]:
        return self.output_shapes_for(self.seq, self.batch)

    def input_shapes_for(self, seq: Any, batch: Any) -> list[tuple[Any, ...]]:
        """:attr:`input_shapes` with the sequence length and batch given (expressions where dynamic)."""
        d, t, v, g = self.directions, self.tiles, LANES, self.gates
        shapes = [(seq, batch, d, t, g, v), (d, t, self.hidden, g, v)]
        if self.quantized:
            shapes.append((d, t, g, v))
        if self.kind == "gru" and self.linear_before_reset:
            shapes.append((d, t, v))
        if self.peepholes:
            shapes.append((d, 3, t, v))
        if self.lengths:
            shapes.append((batch,))
        shapes += [(d, batch, self.hidden)] * (int(self.initial_h) + int(self.initial_c))
        return shapes

    def output_shapes_for(self, seq: Any, batch: Any) -> list[tuple[Any, ...]]:
        """:attr:`output_shapes` with the sequence length and batch given (expressions where dynamic)."""
        d = self.directions
        state = (d, batch, self.hidden)
        return [(seq, d, batch, self.hidden), state] + ([state] if self.kind == "lstm" else [])


@dataclass(frozen=True)
class KernelOptions:
    """How a kernel runs its cell: the same numbers whatever the options."""

    accumulators: int = ACCUMULATORS
    """Vector accumulators (of :data:`LANES`) a block of tiles keeps in registers."""
    parallel: bool = False
    """Tiles of a step shared among the threads of one parallel region (a barrier per step)."""
    gpu: bool = False
    """One GPU thread runs everything (scalar loops, one block): correct, not fast."""

    @classmethod
    def default(cls, cell: RecurrentCell) -> KernelOptions:
        """What the converter emits: a CPU with AVX-512's registers and several cores."""
        return cls(parallel=cell.directions * cell.tiles >= 2 and cell.work >= PARALLEL_MIN_WORK)


class _Builder:
    """Emits the kernel's statements into the IRBuilder frame that is open."""

    def __init__(self, cell: RecurrentCell, options: KernelOptions, args: dict[str, Any], seq: Any,
                 batch: Any) -> None:
        self.cell = cell
        self.options = options
        self.a = args
        self.seq, self.batch = seq, batch
        """The sequence length and batch: ints, or the variables of the input's shape when dynamic."""
        c = cell
        self.h = T.alloc_buffer((2, c.directions, batch, c.padded), c.dtype)
        self.c = T.alloc_buffer((c.directions, batch, c.padded), c.dtype) if c.kind == "lstm" else None
        two_phase = c.kind == "gru" and not c.linear_before_reset
        self.reset = T.alloc_buffer((c.directions, batch, c.padded), c.dtype) if two_phase else None
        self.update = T.alloc_buffer((c.directions, batch, c.padded), c.dtype) if two_phase else None
        self.qparams: Any = None
        """A quantized cell's state scale and zero point, in the block of tiles being emitted."""

    # --- the whole function -------------------------------------------------------------------------------------

    def emit(self) -> None:
        if self.options.gpu:
            # The state buffers above stay outside the kernel: the host allocates them in device memory.
            with T.launch_thread("blockIdx.x", 1), T.launch_thread("threadIdx.x", 1):
                self._body()
        else:
            self._body()

    def _body(self) -> None:
        c = self.cell
        if not c.static:
            self._check_size()
        if c.lengths:
            self._check_lengths()
        self._initial_states()
        if self.options.parallel:
            with T.attr(tirx.const(1, "int32"), "pragma_parallel_launch_point", 1):
                self._steps()
        else:
            self._steps()
        self._final_states()

    def _vector(self, store: Callable[[Any], None]) -> None:
        """``store(lane)`` for the lanes of one tile: one vector statement (a loop on a GPU)."""
        with (T.serial(LANES) if self.options.gpu else T.vectorized(LANES)) as lane:
            store(lane)

    def _check_size(self) -> None:
        """A dynamic kernel indexes in 32 bits, as a static one does: sizes beyond that raise (no GPU check)."""
        if self.options.gpu:
            return
        c = self.cell
        widest = max(c.directions * c.tiles * c.gates * LANES, c.directions * c.hidden)
        elements = tirx.Cast("int64", self.seq) * tirx.Cast("int64", self.batch) * tirx.const(widest, "int64")
        with T.Assert(elements < tirx.const(1 << 31, "int64"),
                      "the recurrent tensors at this sequence length and batch exceed 32-bit indexing"):
            T.evaluate(0)

    def _check_lengths(self) -> None:
        """A length outside [0, seq] raises (on a GPU, where a kernel cannot raise, it is clamped instead)."""
        if self.options.gpu:
            return
        with T.serial(self.batch) as b:
            length = self.a["lengths"][b]
            with T.Assert(tirx.all(length >= 0, length <= self.seq),
                          "sequence_lens must lie between 0 and the sequence length"):
                T.evaluate(0)

    def _length(self, b: Any) -> Any:
        if not self.cell.lengths:
            return tirx.const(self.seq, "int32") if isinstance(self.seq, int) else self.seq
        length = self.a["lengths"][b]
        return tirx.max(tirx.min(length, self.seq), 0) if self.options.gpu else length

    def _initial_states(self) -> None:
        c = self.cell
        states = [(self.h, "h0", lambda d, b, j: [0, d, b, j])]
        if self.c is not None:
            states.append((self.c, "c0", lambda d, b, j: [d, b, j]))
        for buffer, name, index in states:
            given = self.a.get(name)
            with T.serial(c.directions) as d, T.serial(self.batch) as b:
                with T.serial(c.padded) as j:
                    T.buffer_store(buffer, self.cell.const(0.0), index(d, b, j))
                if given is not None:
                    with T.serial(c.hidden) as j:
                        T.buffer_store(buffer, given[d, b, j], index(d, b, j))

    def _final_states(self) -> None:
        """``y_h`` (and ``y_c``): the states after each row's last step; zeros for a row of length 0 (onnxruntime's)."""
        c = self.cell
        last = self.seq % 2 if isinstance(self.seq, int) else tirx.floormod(self.seq, 2)
        with T.serial(c.directions) as d, T.serial(self.batch) as b, T.serial(c.hidden) as j:
            def final(value: Any) -> Any:
                if not c.lengths:
                    return value
                return tirx.Select(self._length(b) > 0, value, c.const(0.0))

            T.buffer_store(self.a["y_h"], final(self.h[last, d, b, j]), [d, b, j])
            if self.c is not None:
                T.buffer_store(self.a["y_c"], final(self.c[d, b, j]), [d, b, j])

    # --- the time loop ----------------------------------------------------------------------------------------------

    def _blocks(self, chains: int, body: Callable[[Any, list[Any]], None]) -> None:
        """``body(d, tiles)`` for every direction and block of tiles; one parallel loop (and a barrier) if parallel.

        A block holds as many tiles as keep ``chains`` accumulators per tile within the options' accumulators
        (a divisor of the tile count): independent FMA chains that share each broadcast state value.
        """
        c, parallel = self.cell, self.options.parallel
        # In parallel, at least two blocks (TVM drops a parallel loop of one iteration, and the launch with it).
        most = c.directions * c.tiles // 2 if parallel else c.tiles
        budget = max(self.options.accumulators, chains)
        size = max(n for n in range(1, c.tiles + 1) if c.tiles % n == 0 and n * chains <= budget and n <= max(most, 1))
        per_direction = c.tiles // size
        count = c.directions * per_direction

        def run(w: Any) -> None:
            first = (w % per_direction) * size
            body(w // per_direction, [first + i for i in range(size)])

        if parallel:
            with T.attr(tirx.const(1, "int32"), "pragma_parallel_barrier_when_finish", 1):
                with T.parallel(count) as w:
                    run(w)
        else:
            with T.serial(count) as w:
                run(w)

    def _steps(self) -> None:
        c = self.cell
        with T.serial(self.seq) as s:
            if self.reset is not None:
                self._blocks(2, lambda d, us: self._rows(s, d, us, self._gru_gates_zr, last_phase=False))
                self._blocks(1, lambda d, us: self._rows(s, d, us, self._gru_candidate))
            else:
                step = {"rnn": self._rnn, "gru": self._gru_fused, "lstm": self._lstm}[c.kind]

                def block(d: Any, us: list[Any]) -> None:
                    if c.quantized:
                        self._quantize_state(s, d)
                    self._rows(s, d, us, step)

                self._blocks({"rnn": 1, "gru": 3, "lstm": 4}[c.kind], block)

    def _quantize_state(self, s: Any, d: Any) -> None:
        """:attr:`qparams`: the scale and zero point that quantize direction ``d``'s state at step ``s`` to uint8
        (onnxruntime's dynamic quantization: the range of every row still running, zero included; scale
        ``range / 255``, zero point rounded half to even). A row past its length counts as zeros, as
        onnxruntime's output rows do. Each block of tiles computes them (in a parallel step, on its thread)."""
        c = self.cell
        f32 = lambda v: tirx.const(v, "float32")  # noqa: E731
        cur = s % 2
        # [low, high, scale, zero point]
        params = T.alloc_buffer((4,), "float32", scope="local" if self.options.gpu else "global")
        for side in (0, 1):
            T.buffer_store(params, f32(0.0), [side])
        with T.serial(self.batch) as b, T.serial(c.hidden) as j:
            value = self.h[cur, d, b, j]
            if c.lengths:
                value = tirx.Select(s <= self._length(b), value, f32(0.0))
            T.buffer_store(params, tirx.min(params[0], value), [0])
            T.buffer_store(params, tirx.max(params[1], value), [1])
        low, high = params[0], params[1]
        T.buffer_store(params, tirx.Select(high == low, f32(1.0), (high - low) / f32(255.0)), [2])
        T.buffer_store(params, tirx.nearbyint(tirx.max(tirx.min(f32(0.0) - low / params[2], f32(255.0)),
                                                       f32(0.0))), [3])
        self.qparams = params

    def _rows(self, s: Any, d: Any, us: list[Any], step: Callable[..., None], last_phase: bool = True) -> None:
        """``step(t, s, d, us, b)`` for every batch row, at the time index direction ``d`` reaches at step ``s``.

        With ``sequence_lens``, a row past its length keeps its state and outputs zeros (in the step's last phase).
        """
        c = self.cell
        with T.serial(self.batch) as b:
            length = self._length(b)
            t = self._time(s, d, length)
            if not c.lengths:
                step(t, s, d, us, b)
                return
            with T.If(s < length):
                with T.Then():
                    step(t, s, d, us, b)
                if last_phase:
                    with T.Else():
                        for u in us:
                            self._skip(s, d, u, b)

    def _time(self, s: Any, d: Any, length: Any) -> Any:
        reverse = self.cell.reverse
        if not any(reverse):
            return s
        backwards = length - 1 - s
        if all(reverse):
            return backwards
        return tirx.Select(d == reverse.index(True), backwards, s)

    def _skip(self, s: Any, d: Any, u: Any, b: Any) -> None:
        """A row past its length: the state carries over, the output row ``s`` is zero."""
        cur, nxt = s % 2, (s + 1) % 2
        unit = lambda lane: u * LANES + lane  # noqa: E731
        self._vector(lambda lane: T.buffer_store(self.h, self.h[cur, d, b, unit(lane)], [nxt, d, b, unit(lane)]))
        self._write_output(s, d, u, b, lambda j: self.cell.const(0.0))

    def _write_output(self, t: Any, d: Any, u: Any, b: Any, value: Callable[[Any], Any]) -> None:
        """``y[t, d, b, j] = value(j)`` for the tile's true units (the last tile may be partial)."""
        c = self.cell
        y = self.a["y"]
        rest = c.hidden - (c.tiles - 1) * LANES
        if rest == LANES:
            self._vector(lambda lane: T.buffer_store(y, value(u * LANES + lane), [t, d, b, u * LANES + lane]))
            return
        with T.If(u < c.tiles - 1):
            with T.Then():
                self._vector(lambda lane: T.buffer_store(y, value(u * LANES + lane), [t, d, b, u * LANES + lane]))
            with T.Else():
                with T.serial(rest) as lane:
                    T.buffer_store(y, value(u * LANES + lane), [t, d, b, u * LANES + lane])

    def _accumulators(self, tiles: int, slots: int) -> Any:
        # On a CPU, scope "global": TVM puts a small constant-size global allocation on the stack (a "local" one
        # would be a workspace allocation, a call per tile); LLVM then keeps it in registers.
        return T.alloc_buffer((tiles, slots, LANES), self.cell.dtype, scope="local" if self.options.gpu else "global")

    def _load_projection(self, acc: Any, t: Any, d: Any, us: list[Any], b: Any, gates: list[tuple[int, int]]) -> None:
        """``acc[i, slot] = xw[t, b, d, us[i], gate]`` for each ``(slot, gate)``."""
        xw = self.a["xw"]
        for i, u in enumerate(us):
            for slot, gate in gates:
                self._vector(lambda lane, i=i, u=u, slot=slot, gate=gate: T.buffer_store(
                    acc, xw[t, b, d, u, gate, lane], [i, slot, lane]))

    def _recurrent(self, acc: Any, gates: list[tuple[int, int]], state: Any, state_index: Callable[[Any], list],
                   d: Any, us: list[Any]) -> None:
        """``acc[i, slot] += sum_k state[k] R^T[k, gate, us[i]]`` for each ``(slot, gate)``: one pass over k."""
        r = self.a["r"]
        with T.serial(self.cell.hidden) as k:
            hk = state[tuple(state_index(k))]
            for i, u in enumerate(us):
                for slot, gate in gates:
                    self._vector(lambda lane, i=i, u=u, slot=slot, gate=gate: T.buffer_store(
                        acc, acc[i, slot, lane] + hk * r[d, u, k, gate, lane], [i, slot, lane]))

    def _quantized_recurrent(self, acc: Any, gates: list[tuple[int, int]], s: Any, d: Any, b: Any,
                             us: list[Any]) -> None:
        """``acc[i, slot] += (sum_k q(h[k]) R^T[k, gate, us[i]]) * state scale * R's scale``: ``q`` the state's
        uint8 level less its zero point (values rounded half to even), the sum in :attr:`RecurrentCell.quantized`."""
        r, r_scale = self.a["r"], self.a["r_scale"]
        scale, zero = self.qparams[2], self.qparams[3]
        f32 = lambda v: tirx.const(v, "float32")  # noqa: E731
        cur = s % 2
        sums = self.cell.quantized
        total = T.alloc_buffer((len(us), len(gates), LANES), sums, scope="local" if self.options.gpu else "global")
        for i in range(len(us)):
            for slot, _ in gates:
                self._vector(lambda lane, i=i, slot=slot: T.buffer_store(total, tirx.const(0, sums),
                                                                         [i, slot, lane]))
        with T.serial(self.cell.hidden) as k:
            level = tirx.nearbyint(self.h[cur, d, b, k] / scale) + zero
            qk = tirx.Cast(sums, tirx.max(tirx.min(level, f32(255.0)), f32(0.0)) - zero)
            for i, u in enumerate(us):
                for slot, gate in gates:
                    self._vector(lambda lane, i=i, u=u, slot=slot, gate=gate: T.buffer_store(
                        total, total[i, slot, lane] + qk * r[d, u, k, gate, lane], [i, slot, lane]))
        for i, u in enumerate(us):
            for slot, gate in gates:
                self._vector(lambda lane, i=i, u=u, slot=slot, gate=gate: T.buffer_store(
                    acc, acc[i, slot, lane] + tirx.Cast("float32", total[i, slot, lane])
                    * (scale * r_scale[d, u, gate, lane]), [i, slot, lane]))

    def _clipped(self, x: Any) -> Any:
        if self.cell.clip is None:
            return x
        bound = float(self.cell.clip)
        return tirx.max(tirx.min(x, self.cell.const(bound)), self.cell.const(-bound))

    def _activation(self, d: Any, which: int, x: Any, clipped: bool = True) -> Any:
        """Activation ``which`` of direction ``d`` (directions may differ: a select between them).

        ``clip`` bounds the gates' inputs (``clipped``), not LSTM's cell state before its output activation.
        """
        functions = [acts[which] for acts in self.cell.activations]
        x = self._clipped(x) if clipped else x
        result = functions[-1](x)
        for index in range(len(functions) - 2, -1, -1):
            if functions[index] != functions[-1]:
                result = tirx.Select(d == index, functions[index](x), result)
        return result

    def _finish(self, t: Any, s: Any, d: Any, u: Any, b: Any, new_h: Callable[[Any], Any]) -> None:
        """Store tile ``u``'s new hidden state (from ``new_h(lane)``) and its output row."""
        nxt = (s + 1) % 2
        self._vector(lambda lane: T.buffer_store(self.h, new_h(lane), [nxt, d, b, u * LANES + lane]))
        self._write_output(t, d, u, b, lambda j: self.h[nxt, d, b, j])

    # --- the cells: one block of tiles, one batch row -----------------------------------------------------------------

    def _rnn(self, t: Any, s: Any, d: Any, us: list[Any], b: Any) -> None:
        cur = s % 2
        acc = self._accumulators(len(us), 1)
        self._load_projection(acc, t, d, us, b, [(0, 0)])
        self._recurrent(acc, [(0, 0)], self.h, lambda k: [cur, d, b, k], d, us)
        for i, u in enumerate(us):
            self._finish(t, s, d, u, b, lambda lane, i=i: self._activation(d, 0, acc[i, 0, lane]))

    def _lstm(self, t: Any, s: Any, d: Any, us: list[Any], b: Any) -> None:
        """ONNX gates i, o, f, c: ``c = f*c + i*g(.)``, ``h = o*h(c)``, peepholes on i and f (old c) and o (new c)."""
        cur = s % 2
        acc = self._accumulators(len(us), 4)
        gates = [(0, 0), (1, 1), (2, 2), (3, 3)]
        self._load_projection(acc, t, d, us, b, gates)
        if self.cell.quantized:
            self._quantized_recurrent(acc, gates, s, d, b, us)
        else:
            self._recurrent(acc, gates, self.h, lambda k: [cur, d, b, k], d, us)
        for i, u in enumerate(us):
            self._lstm_update(acc, i, s, t, d, u, b)

    def _lstm_update(self, acc: Any, tile: int, s: Any, t: Any, d: Any, u: Any, b: Any) -> None:
        cell = self.cell
        i, o, f, g = 0, 1, 2, 3
        gate = lambda slot, lane: acc[tile, slot, lane]  # noqa: E731

        def set_gate(slot: int, value: Callable[[Any], Any]) -> None:
            self._vector(lambda lane: T.buffer_store(acc, value(lane), [tile, slot, lane]))

        c_state = lambda lane: self.c[d, b, u * LANES + lane]  # noqa: E731
        if cell.peepholes:
            peep = lambda which, lane: self.a["p"][d, which, u, lane]  # noqa: E731
            set_gate(i, lambda lane: gate(i, lane) + peep(0, lane) * c_state(lane))
            set_gate(f, lambda lane: gate(f, lane) + peep(2, lane) * c_state(lane))
        set_gate(i, lambda lane: self._activation(d, 0, gate(i, lane)))
        if cell.input_forget:
            set_gate(f, lambda lane: cell.const(1.0) - gate(i, lane))
        else:
            set_gate(f, lambda lane: self._activation(d, 0, gate(f, lane)))
        set_gate(g, lambda lane: self._activation(d, 1, gate(g, lane)))
        self._vector(lambda lane: T.buffer_store(self.c, gate(f, lane) * c_state(lane) + gate(i, lane) * gate(g, lane),
                                         [d, b, u * LANES + lane]))
        if cell.peepholes:
            set_gate(o, lambda lane: gate(o, lane) + peep(1, lane) * c_state(lane))  # the new c
        set_gate(o, lambda lane: self._activation(d, 0, gate(o, lane)))
        self._finish(t, s, d, u, b, lambda lane: gate(o, lane) * self._activation(d, 2, c_state(lane), clipped=False))

    def _gru_fused(self, t: Any, s: Any, d: Any, us: list[Any], b: Any) -> None:
        """``linear_before_reset``: ``n = g(xh + r * (h R_h^T + Rb_h))``, one pass over R."""
        cur = s % 2
        z, r, xh, rh = 0, 1, 2, 3  # the projection of h and the recurrent term of h apart
        acc = self._accumulators(len(us), 4)
        self._load_projection(acc, t, d, us, b, [(z, 0), (r, 1), (xh, 2)])
        for i, u in enumerate(us):
            self._vector(lambda lane, i=i, u=u: T.buffer_store(acc, self.a["rbh"][d, u, lane], [i, rh, lane]))
        self._recurrent(acc, [(z, 0), (r, 1), (rh, 2)], self.h, lambda k: [cur, d, b, k], d, us)
        for i, u in enumerate(us):
            self._gru_fused_update(acc, i, s, t, d, u, b)

    def _gru_fused_update(self, acc: Any, tile: int, s: Any, t: Any, d: Any, u: Any, b: Any) -> None:
        z, r, xh, rh = 0, 1, 2, 3
        gate = lambda slot, lane: acc[tile, slot, lane]  # noqa: E731

        def set_gate(slot: int, value: Callable[[Any], Any]) -> None:
            self._vector(lambda lane: T.buffer_store(acc, value(lane), [tile, slot, lane]))

        set_gate(z, lambda lane: self._activation(d, 0, gate(z, lane)))
        set_gate(r, lambda lane: self._activation(d, 0, gate(r, lane)))
        set_gate(xh, lambda lane: self._activation(d, 1, gate(xh, lane) + gate(r, lane) * gate(rh, lane)))
        one, cur = self.cell.const(1.0), s % 2
        h_old = lambda lane: self.h[cur, d, b, u * LANES + lane]  # noqa: E731
        self._finish(t, s, d, u, b, lambda lane: (one - gate(z, lane)) * gate(xh, lane) + gate(z, lane) * h_old(lane))

    def _gru_gates_zr(self, t: Any, s: Any, d: Any, us: list[Any], b: Any) -> None:
        """First phase without ``linear_before_reset``: z, and ``r * h`` for the candidate's product."""
        cur = s % 2
        acc = self._accumulators(len(us), 2)
        self._load_projection(acc, t, d, us, b, [(0, 0), (1, 1)])
        self._recurrent(acc, [(0, 0), (1, 1)], self.h, lambda k: [cur, d, b, k], d, us)
        for i, u in enumerate(us):
            unit = lambda lane, u=u: u * LANES + lane  # noqa: E731
            self._vector(lambda lane, i=i, unit=unit: T.buffer_store(
                self.update, self._activation(d, 0, acc[i, 0, lane]), [d, b, unit(lane)]))
            self._vector(lambda lane, i=i, unit=unit: T.buffer_store(
                self.reset, self._activation(d, 0, acc[i, 1, lane]) * self.h[cur, d, b, unit(lane)],
                [d, b, unit(lane)]))

    def _gru_candidate(self, t: Any, s: Any, d: Any, us: list[Any], b: Any) -> None:
        """Second phase: ``n = g(xh + (r * h) R_h^T)``, ``h = (1 - z) n + z h``."""
        cur = s % 2
        acc = self._accumulators(len(us), 1)
        self._load_projection(acc, t, d, us, b, [(0, 2)])
        self._recurrent(acc, [(0, 2)], self.reset, lambda k: [d, b, k], d, us)
        one = self.cell.const(1.0)
        for i, u in enumerate(us):
            z = lambda lane, u=u: self.update[d, b, u * LANES + lane]  # noqa: E731
            h_old = lambda lane, u=u: self.h[cur, d, b, u * LANES + lane]  # noqa: E731
            self._finish(t, s, d, u, b, lambda lane, i=i, z=z, h_old=h_old: (
                (one - z(lane)) * self._activation(d, 1, acc[i, 0, lane]) + z(lane) * h_old(lane)))


CELL_ATTR = RECURRENT_CELL_ATTR
"""The kernel's :class:`RecurrentCell` as JSON, for passes that rebuild it for a target."""
OPTIONS_ATTR = "forge.recurrent_options"
"""The :class:`KernelOptions` it was built with, as JSON."""


def build_kernel(cell: RecurrentCell, options: KernelOptions | None = None) -> tirx.PrimFunc:
    """The PrimFunc for ``cell``: inputs in :attr:`RecurrentCell.input_shapes` order, then the outputs.

    ``options`` default to :meth:`KernelOptions.default`. It has no global symbol: the module that receives
    it names it (several kernels may share a model).
    """
    options = options or KernelOptions.default(cell)
    names = ["xw", "r"] + (["r_scale"] if cell.quantized else [])
    if cell.kind == "gru" and cell.linear_before_reset:
        names.append("rbh")
    if cell.peepholes:
        names.append("p")
    if cell.lengths:
        names.append("lengths")
    names += (["h0"] if cell.initial_h else []) + (["c0"] if cell.initial_c else [])
    outputs = ["y", "y_h"] + (["y_c"] if cell.kind == "lstm" else [])
    # A dynamic sequence length or batch is a variable of the buffers' shapes, bound from the arguments.
    seq = cell.seq if cell.seq is not None else tirx.Var("seq", "int32")
    batch = cell.batch if cell.batch is not None else tirx.Var("batch", "int32")
    with IRBuilder() as ib:
        with T.prim_func(s_tir=True):
            args = {}
            for arg, shape in zip(names, cell.input_shapes_for(seq, batch)):
                dtype = "int32" if arg == "lengths" else cell.quantized if arg == "r" and cell.quantized else cell.dtype
                args[arg] = T.arg(arg, T.Buffer(shape, dtype))
            for arg, shape in zip(outputs, cell.output_shapes_for(seq, batch)):
                args[arg] = T.arg(arg, T.Buffer(shape, cell.dtype))
            # Scheduled as written: schedule rules and tuning leave it alone; the compile log names it.
            T.func_attr({"tirx.noalias": True, CELL_ATTR: cell.to_json(),
                         OPTIONS_ATTR: json.dumps(dataclasses.asdict(options)), SCHEDULED_ATTR: True,
                         RULE_ATTR: RULE_NAME})
            with T.sblock("root"):
                _Builder(cell, options, args, seq, batch).emit()
    return ib.get()
