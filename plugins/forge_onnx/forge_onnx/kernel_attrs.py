"""Names of the PrimFunc attributes forge_onnx's kernels carry (importing this module imports nothing)."""

RECURRENT_CELL_ATTR = "forge.recurrent_cell"
"""Marks a recurrent kernel (the RNN/GRU/LSTM converters'): the ``recurrent_kernels`` schedule pass runs only on
modules holding one."""
