"""Forge's TensorRT plugin: ``partition_for_tensorrt`` for TVM's IR, and ``ONNXModule``, the ONNX route to TensorRT."""

__version__ = "0.1.0"
