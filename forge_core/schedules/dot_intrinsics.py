"""Integer dot-product intrinsics for tensorized uint8 x int8 -> int32 kernels.

Each intrinsic computes ``C[i] += sum_k A[k] * B[i, k]`` for 16 (or 8, the
256-bit form, for channel counts such as 24) output lanes and a reduction of 4: one x86 VNNI instruction (``vpdpbusd``),
``A`` 4 uint8 broadcast to every lane, ``B`` a 16x4 int8 block, ``C`` 16
int32 accumulators, 64 multiply-adds. The accumulators are the kernel's
register tile (scope ``local``).

On Arm with ``+dotprod`` (Cortex-A76 and later: Raspberry Pi 5), ``sdot``
does the same for int8 x int8 into 4 lanes; activations then stay int8.

TVM 0.27's own ``dot_16x4_vnni`` passes its operands as ``int32x16`` where
LLVM 22's intrinsic expects ``<64 x i8>``, and LLVM's verifier rejects the
call; these pass the bytes as ``uint8x64`` (``A`` broadcast, then
reinterpreted) and ``int8x64``.

No saturating form (``pmaddubsw``, TVM's ``dot_16x4_avx512``) is used: it
saturates int16 pairs on full-range uint8 x int8 data. x86 without VNNI
(AVX2; AVX-512 without VNNI) takes ``vpmaddwd`` instead: the lowering holds
the weights as int16, the schedules widen the activations to int16 as they
repack them (``unsafe_set_dtype``, read back through their byte type, which
the descriptions match), and each instruction
multiplies 2 activations, broadcast, by 8 or 16 pairs of weights (or, pixels
as lanes, 8 or 16 pixels' pairs by one channel's 2 weights) into int32 lanes,
exactly: 255 x -128 x 2 is far inside int32.

:func:`interleave` is the input repack those kernels read: ``P`` pixels of 4
channel rows of an NCHW feature map become ``P`` groups of 4 bytes, one pixel's
4 channels together (the dot products' broadcast, or lane, operand): 4 vector
loads and one shuffle where the repack had been a scalar byte store per
element.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

VNNI_16x4 = "forge_dot_16x4_u8i8i32_vnni"
VNNI_8x4 = "forge_dot_8x4_u8i8i32_vnni"
SDOT_4x4 = "forge_dot_4x4_i8i8i32_sdot"
PMADDWD_8x2 = "forge_dot_8x2_i16i16i32_pmaddwd"
PMADDWD_16x2 = "forge_dot_16x2_i16i16i32_pmaddwd"
PMADDWD_PIXELS_8x2 = "forge_dot_8x2_i16i16i32_pmaddwd_pixels"
PMADDWD_PIXELS_16x2 = "forge_dot_16x2_i16i16i32_pmaddwd_pixels"
VNNI_PIXELS_16x4 = "forge_dot_16x4_u8i8i32_vnni_pixels"


def _description(lanes: int, data: str = "uint8", scope: str = "local") -> tvm.tirx.PrimFunc:
    @T.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), data, offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vk], "int32") * T.cast(B[vi, vk], "int32")

    return description


def _vnni(lanes: int, llvm_name: str, scope: str = "local") -> tvm.tirx.PrimFunc:
    bytes_ = lanes * 4

    @T.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "uint8", offset_factor=1)
        B = T.match_buffer(b, (lanes, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:4], B[0:lanes, 0:4])
            T.writes(C[0:lanes])
            a_word = T.reinterpret(A.vload([0], "uint8x4"), dtype="int32")
            a_bytes = T.reinterpret(T.broadcast(a_word, lanes), dtype=f"uint8x{bytes_}")
            C[T.ramp(T.int32(0), 1, lanes)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                C.vload([0], dtype=f"int32x{lanes}"),
                a_bytes,
                B.vload([0, 0], dtype=f"int8x{bytes_}"),
                dtype=f"int32x{lanes}",
            )

    return implementation


def _widened_description(lanes: int) -> tvm.tirx.PrimFunc:
    """:func:`_description` over int16 operands: uint8 activations widened in their repack
    (``unsafe_set_dtype``, read back through their byte type) and int8 weights the lowering holds as int16;
    a reduction of 2."""

    @T.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2,), "int16", offset_factor=1)
        B = T.match_buffer(b, (lanes, 2), "int16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(T.cast(A[vk], "uint8"), "int32") * T.cast(B[vi, vk], "int32")

    return description


def _pmaddwd(lanes: int, llvm_name: str) -> tvm.tirx.PrimFunc:
    """``vpmaddwd``: 2 int16 activations, broadcast, times ``lanes`` pairs of int16 weights, summed in pairs
    into ``lanes`` int32 (never saturates: |255 * -128| * 2 < 2^31), then added to the accumulators."""

    @T.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (2,), "int16", offset_factor=1)
        B = T.match_buffer(b, (lanes, 2), "int16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:2], B[0:lanes, 0:2])
            T.writes(C[0:lanes])
            a_pair = T.reinterpret(A.vload([0], "int16x2"), dtype="int32")
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                T.reinterpret(T.broadcast(a_pair, lanes), dtype=f"int16x{2 * lanes}"),
                B.vload([0, 0], dtype=f"int16x{2 * lanes}"),
                dtype=f"int32x{lanes}",
            )

    return implementation


def _widened_pixels_description(lanes: int) -> tvm.tirx.PrimFunc:
    """:func:`_pixels_description` over operands widened to int16 (:func:`_widened_description`), a reduction
    of 2."""

    @T.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (lanes, 2), "int16", offset_factor=1)
        B = T.match_buffer(b, (2,), "int16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:lanes, 0:2], B[0:2])
            T.writes(C[0:lanes])
            for i in T.serial(0, lanes):
                for k in T.serial(0, 2):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(T.cast(A[vi, vk], "uint8"), "int32") * T.cast(B[vk], "int32")

    return description


def _pmaddwd_pixels(lanes: int, llvm_name: str) -> tvm.tirx.PrimFunc:
    """``vpmaddwd`` with pixels as lanes: ``lanes`` pixels x 2 channels of int16 activations times the 2
    weights of one output channel, broadcast."""

    @T.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (lanes, 2), "int16", offset_factor=1)
        B = T.match_buffer(b, (2,), "int16", offset_factor=1)
        C = T.match_buffer(c, (lanes,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:lanes], A[0:lanes, 0:2], B[0:2])
            T.writes(C[0:lanes])
            b_pair = T.reinterpret(B.vload([0], "int16x2"), dtype="int32")
            C[T.ramp(T.int32(0), 1, lanes)] = C.vload([0], dtype=f"int32x{lanes}") + T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id(llvm_name),
                A.vload([0, 0], dtype=f"int16x{2 * lanes}"),
                T.reinterpret(T.broadcast(b_pair, lanes), dtype=f"int16x{2 * lanes}"),
                dtype=f"int32x{lanes}",
            )

    return implementation


def _pixels_description() -> tvm.tirx.PrimFunc:
    @T.prim_func(s_tir=True)
    def description(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 4), "uint8", offset_factor=1)
        B = T.match_buffer(b, (4,), "int8", offset_factor=1)
        C = T.match_buffer(c, (16,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:16], A[0:16, 0:4], B[0:4])
            T.writes(C[0:16])
            for i in T.serial(0, 16):
                for k in T.serial(0, 4):
                    with T.sblock("update"):
                        vi, vk = T.axis.remap("SR", [i, k])
                        C[vi] = C[vi] + T.cast(A[vi, vk], "int32") * T.cast(B[vk], "int32")

    return description


def _vnni_pixels() -> tvm.tirx.PrimFunc:
    @T.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (16, 4), "uint8", offset_factor=1)
        B = T.match_buffer(b, (4,), "int8", offset_factor=1)
        C = T.match_buffer(c, (16,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:16], A[0:16, 0:4], B[0:4])
            T.writes(C[0:16])
            b_word = T.reinterpret(B.vload([0], "int8x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.x86.avx512.vpdpbusd.512"),
                C.vload([0], dtype="int32x16"),
                A.vload([0, 0], dtype="uint8x64"),
                T.reinterpret(T.broadcast(b_word, 16), dtype="int8x64"),
                dtype="int32x16",
            )

    return implementation


def _sdot() -> tvm.tirx.PrimFunc:
    @T.prim_func(s_tir=True)
    def implementation(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (4,), "int8", offset_factor=1)
        B = T.match_buffer(b, (4, 4), "int8", offset_factor=1)
        C = T.match_buffer(c, (4,), "int32", offset_factor=1, scope="local")
        with T.sblock("root"):
            T.reads(C[0:4], A[0:4], B[0:4, 0:4])
            T.writes(C[0:4])
            a_word = T.reinterpret(A.vload([0], "int8x4"), dtype="int32")
            C[T.ramp(T.int32(0), 1, 4)] = T.call_llvm_pure_intrin(
                T.llvm_lookup_intrinsic_id("llvm.aarch64.neon.sdot.v4i32.v16i8"),
                C.vload([0], dtype="int32x4"),
                T.reinterpret(T.broadcast(a_word, 4), dtype="int8x16"),
                B.vload([0, 0], dtype="int8x16"),
                dtype="int32x4",
            )

    return implementation


def _interleave_source(pixels: int, dtype: str, implementation: bool, rows: int = 4, out: str | None = None) -> str:
    out = out or dtype
    head = f"""
@T.prim_func(s_tir=True)
def interleave(a: T.handle, b: T.handle) -> None:
    channel_stride = T.int64()
    row_stride = T.int64()
    A = T.match_buffer(a, ({rows}, 1, {pixels}), "{dtype}", offset_factor=1, strides=[channel_stride, row_stride, 1])
    B = T.match_buffer(b, ({pixels}, {rows}), "{out}", offset_factor=1)
    with T.sblock("root"):
        T.reads(A[0:{rows}, 0, 0:{pixels}])
        T.writes(B[0:{pixels}, 0:{rows}])
"""
    if not implementation:
        value = "A[vk, 0, vi]" if out == dtype else f'T.Cast("{out}", A[vk, 0, vi])'
        return head + f"""        for i in T.serial(0, {pixels}):
            for k in T.serial(0, {rows}):
                with T.sblock("interleave"):
                    vi, vk = T.axis.remap("SS", [i, k])
                    B[vi, vk] = {value}
"""
    loads = [f"A[{k}, 0, T.ramp(T.int64(0), 1, {pixels})]" for k in range(rows)]
    if out != dtype:
        loads = [f'T.Cast("{out}x{pixels}", {load})' for load in loads]
    order = [k * pixels + i for i in range(pixels) for k in range(rows)]
    return head + f"        B[0, T.ramp(T.int64(0), 1, {rows * pixels})] = T.Shuffle([{', '.join(loads)}], {order})\n"


# Pixels per interleave, best first (measured on AVX-512: power-of-two vectors, then a whole row of 14 or 7;
# 2 last, for even rows nothing else divides: MobileNetV2's pre-padded 226-pixel stem input, 0.189 -> 0.134 ms
# for the whole stem against the byte-by-byte loop).
INTERLEAVE_PIXELS = (16, 8, 14, 4, 7, 2)


def interleave(pixels: int, dtype: str, rows: int = 4, out: str | None = None) -> str:
    """The intrinsic turning ``[rows channels, 1 row, pixels]`` of ``dtype`` into ``[pixels, rows]`` (of ``out``,
    widened as it is written, when given; registered once)."""
    suffix = "" if rows == 4 and out in (None, dtype) else f"_{rows}_{out}"
    return _register(f"forge_interleave_4x{pixels}_{dtype}{suffix}",
                     lambda implementation: _interleave_source(pixels, dtype, implementation, rows, out))


def _transpose_source(pixels: int, channels: int, dtype: str, implementation: bool) -> str:
    head = f"""
@T.prim_func(s_tir=True)
def transpose(a: T.handle, b: T.handle) -> None:
    pixel_stride = T.int64()
    channel_stride = T.int64()
    row_stride = T.int64()
    A = T.match_buffer(a, ({pixels}, {channels}), "{dtype}", offset_factor=1, strides=[pixel_stride, 1], scope="local")
    B = T.match_buffer(b, ({channels}, 1, {pixels}), "{dtype}", offset_factor=1,
                       strides=[channel_stride, row_stride, 1])
    with T.sblock("root"):
        T.reads(A[0:{pixels}, 0:{channels}])
        T.writes(B[0:{channels}, 0, 0:{pixels}])
"""
    if not implementation:
        return head + f"""        for c in T.serial(0, {channels}):
            for x in T.serial(0, {pixels}):
                with T.sblock("transpose"):
                    vc, vx = T.axis.remap("SS", [c, x])
                    B[vc, 0, vx] = A[vx, vc]
"""
    pixel_vectors = ", ".join(f"A[{x}, T.ramp(T.int64(0), 1, {channels})]" for x in range(pixels))
    return head + "".join(
        f"        B[{c}, 0, T.ramp(T.int64(0), 1, {pixels})] = "
        f"T.Shuffle([{pixel_vectors}], {[x * channels + c for x in range(pixels)]})\n" for c in range(channels))


def transpose(pixels: int, channels: int, dtype: str) -> str:
    """The intrinsic storing ``[pixels, channels]`` (one pixel's channels together, as a channel-lane kernel
    computes them) into ``channels`` rows of ``pixels`` of an NCHW output: one shuffle a row, where the
    epilogue had stored each byte alone. Registered once."""
    return _register(f"forge_transpose_{pixels}x{channels}_{dtype}",
                     lambda implementation: _transpose_source(pixels, channels, dtype, implementation))


def _register(name: str, source: Callable[[bool], str]) -> str:
    """Register the intrinsic ``name`` once, its description and implementation parsed from ``source``'s text
    (a shuffle needs constant indices: the text holds one statement a row)."""
    if name not in _layouts:
        import tvm.script

        description, implementation = (tvm.script.from_source(source(impl), extra_vars={"T": T})
                                       for impl in (False, True))
        TensorIntrin.register(name, description, implementation, override=True)
        _layouts.add(name)
    return name


_layouts: set[str] = set()
_registered = False


def register() -> None:
    """Register Forge's intrinsics once (idempotent)."""
    global _registered
    if _registered:
        return
    TensorIntrin.register(VNNI_16x4, _description(16), _vnni(16, "llvm.x86.avx512.vpdpbusd.512"), override=True)
    TensorIntrin.register(VNNI_8x4, _description(8), _vnni(8, "llvm.x86.avx512.vpdpbusd.256"), override=True)
    TensorIntrin.register(VNNI_PIXELS_16x4, _pixels_description(), _vnni_pixels(), override=True)
    TensorIntrin.register(SDOT_4x4, _description(4, "int8"), _sdot(), override=True)
    TensorIntrin.register(PMADDWD_8x2, _widened_description(8), _pmaddwd(8, "llvm.x86.avx2.pmadd.wd"), override=True)
    TensorIntrin.register(PMADDWD_16x2, _widened_description(16), _pmaddwd(16, "llvm.x86.avx512.pmaddw.d.512"),
                          override=True)
    TensorIntrin.register(PMADDWD_PIXELS_8x2, _widened_pixels_description(8),
                          _pmaddwd_pixels(8, "llvm.x86.avx2.pmadd.wd"), override=True)
    TensorIntrin.register(PMADDWD_PIXELS_16x2, _widened_pixels_description(16),
                          _pmaddwd_pixels(16, "llvm.x86.avx512.pmaddw.d.512"), override=True)
    _registered = True



def override_tvm_x86() -> None:
    """TVM's own x86 intrinsics, which MetaSchedule's search tensorizes with (and its records name), made correct.

    The search's x86 design spaces tensorize with ``dot_16x4_vnni`` on a VNNI
    target, which fails LLVM's verifier (see the module doc), and with
    ``dot_16x4_avx512`` on an AVX-512 target without VNNI, whose
    ``pmaddubsw`` saturates on full-range uint8 x int8 data: a tuned record
    could then give wrong numbers. Under the same names, the first becomes
    Forge's ``vpdpbusd`` implementation and the second plain int32
    multiply-adds (exact; the search measures them and keeps the faster
    schedule). Needs ``tvm.s_tir.tensor_intrin.x86`` imported (it registers
    the names); idempotent.
    """
    from tvm.s_tir.tensor_intrin import x86

    description = x86.dot_product_16x4_u8i8i32_desc
    TensorIntrin.register(x86.VNNI_DOT_16x4_INTRIN, description,
                          _vnni(16, "llvm.x86.avx512.vpdpbusd.512", scope="global"), override=True)
    TensorIntrin.register(x86.AVX512_DOT_16x4_INTRIN, description, _description(16, scope="global"), override=True)
