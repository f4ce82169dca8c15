"""The suite's cases: ONNX's node cases and the model cases its wheel ships, on CPU."""

from __future__ import annotations

import unittest
import warnings
from typing import Any

from onnx.backend.base import Backend, Device, DeviceType

CATEGORY_OF_CLASS = {
    "OnnxBackendNodeModelTest": "node",
    "OnnxBackendRealModelTest": "light",
    "OnnxBackendSimpleModelTest": "simple",
    "OnnxBackendPyTorchConvertedModelTest": "pytorch-converted",
    "OnnxBackendPyTorchOperatorModelTest": "pytorch-operator",
}


class _Listing(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        return Device(device).type == DeviceType.CPU


def all_cases() -> dict[str, str]:
    """Case name (``test_abs_cpu``) -> category, for every CPU case."""
    import onnx.backend.test

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        classes: dict[str, Any] = onnx.backend.test.BackendTest(_Listing, __name__).test_cases
    cases = {}
    for class_name, test_class in classes.items():
        category = CATEGORY_OF_CLASS.get(class_name, class_name)
        for name in unittest.defaultTestLoader.getTestCaseNames(test_class):
            if name.endswith("_cpu"):
                cases[name] = category
    return cases
