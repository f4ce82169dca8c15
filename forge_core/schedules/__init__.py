"""Forge's default CPU schedules: rules that make legalized operators fast without tuning.

Each rule is a :class:`tvm.s_tir.dlight.ScheduleRule`: ``apply(func, target,
tunable)`` returns a scheduled :class:`tvm.s_tir.Schedule` for the PrimFuncs it
recognises and ``None`` otherwise. :func:`apply_rules` tries the rules in order
on every fused PrimFunc; the first that returns a schedule wins.

Rules, most specific first:

* :class:`Int8PointwiseConv2dNCHW`, :class:`Int8Conv2dNCHW` and
  :class:`Int8Matmul`: the integer convolutions and dense layers of a
  quantized module (uint8 x int8 -> int32, see
  :mod:`forge_core.quantization.lowering`), tensorized with x86 VNNI's
  ``vpdpbusd`` (Arm ``+dotprod``: ``sdot`` on int8; x86 AVX2 or AVX-512
  without VNNI: ``vpmaddwd`` on operands widened to int16); weights repacked at
  compile time, the requantizing epilogue fused; 1x1 convolutions over
  feature maps of whole vectors of pixels put pixels in the lanes
  (:mod:`forge_core.schedules.int8`).
* :class:`PointwiseConv2dNCHW`: 1x1 convolution (stride 1, no padding) on
  feature maps of whole vectors of pixels: a matrix product vectorized along
  the pixels, a register tile of up to 8 output channels by several vectors (the
  last pixel tile overlapping the one before where the tile does not divide the map);
  grouped ones too, each tile within one group.
* :class:`PaddedPointwiseConv2dNCHW` (x86: AVX2, AVX-512): 1x1
  convolutions over maps whose pixels are not whole vectors and whose rows
  are too short for Conv2dNCHW's multi-vector tile (7x7, 13x13), rebuilt
  on a copy of the input padded to whole pixel tiles, the reduction in chunks.
* :class:`Conv2dNCHW`: convolution (groups=1), NCHW activations, weights
  repacked at compile time to ``[F/v, C, KH, KW, v]``; a register tile of up to
  16 output pixels by one vector of output channels (1x1 kernels and rows of
  at most 7 pixels: up to 14 pixels by two vectors; AVX2: 1 to 4 vectors by
  a run of pixels, a tile of more vectors than pixels reducing in chunks of
  8 KB of weights); fused epilogues (bias, residual add, relu, clip) write
  each tile back.
* :class:`DynamicPointwiseConv2dNCHW`, :class:`DynamicConv2dNCHW` and
  :class:`DynamicGroupedConv2dNCHW`: the same tiles over a dynamic height and
  width, the last tile of a row (of the fused pixel axis, for 1x1
  convolutions) clamped to its end (:mod:`forge_core.schedules.dynamic_conv`);
  :class:`DynamicExcitationConv2dNCHW`, a squeeze-and-excite 1x1 convolution
  whose epilogue scales a map of a dynamic size.
* :class:`FlatDepthwiseNCHW`: a quantized module's stride-1 depthwise
  convolutions with a requantizing epilogue on rows that are not whole
  vectors (7, 14, 28, 56 pixels): convolution and epilogue computed in
  vectors over the flat grid of the padded plane, its extra columns dropped
  (:mod:`forge_core.schedules.depthwise_flat`).
* :class:`GroupedConv2dNCHW`: depthwise and grouped convolutions, vectorized
  along the output row (a tile of one or half a vector on long rows),
  padding computed per channel plane; a quantized module's read its uint8
  input directly.
* :class:`ConvTransposeNCHW`: transposed convolutions (1D, 2D, any groups),
  rebuilt as a gather split by output phase (TOPI multiplies a zero-inserted
  input: ``s**2`` times the work), tiled by pixels or by channels; over a
  dynamic size, by channels with the clamped last tile.
* :class:`ConvNCX` and :class:`GroupedConvNCX`: conv1d and conv3d (groups=1:
  Conv2dNCHW's tile, also across images for short rows, output channels padded
  to whole vectors when none divides them; grouped and depthwise: rows
  vectorized in registers).
* :class:`WindowPoolNCX`: max and average pooling in 1 to 3 dimensions,
  parallel over channel planes, rows vectorized; :class:`DynamicWindowPoolNCX`
  over a dynamic size (1D and 2D), the last tile of a row clamped.
* :class:`Matmul`: dense, matmul and batch matmul; register tile of up to 8
  rows by several vectors of columns, constant right-hand sides repacked.
* :class:`WholeTensorReduction`: a softmax or normalization over a single
  row (a classifier's ``[1, 1000]``), stage by stage, spatial stages vectorized.
* :class:`PlaneReduction`: a sum, max or min over an input's trailing axes
  (global pooling, squeeze-and-excite means), planes in parallel, each
  reduced by vectors of partial sums; :class:`DynamicPlaneReduction` over
  planes of a dynamic size, the last step guarded.
* TVM's ``dlight.cpu.Reduction``: softmax, layer norm, other reductions.
* :class:`Elementwise`: injective chains, inlined, parallel and vectorized.
* :class:`Generic`: anything else, parallel over its leading spatial loops.
  Functions it takes are reported as fallbacks.

Vector width and register count come from the target (AVX-512: 16 float32
lanes and 32 registers; AVX2: 8 lanes and 16; NEON: 4 lanes and 32).
"""

from forge_core.schedules.apply import apply_rules, default_rules, schedule_report

__all__ = ["apply_rules", "default_rules", "schedule_report"]
