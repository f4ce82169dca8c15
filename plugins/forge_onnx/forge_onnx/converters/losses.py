"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, as the ONNX specification defines them."""

from __future__ import annotations

from typing import Any

from tvm import relax

from forge_core.errors import InvalidModelError
from forge_onnx.converters import ConverterContext


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _nll(bb: relax.BlockBuilder, log_probs: relax.Expr, target: relax.Expr, weight: relax.Expr | None,
         reduction: str, ignore_index: int | None) -> relax.Expr:
    dtype = str(log_probs.ty.dtype)
    target = bb.emit(relax.op.astype(target, "int64"))
    if ignore_index is not None:
        ignored = bb.emit(relax.op.equal(target, relax.const(ignore_index, "int64")))
        safe = bb.emit(relax.op.where(ignored, relax.const(0, "int64"), target))
    else:
        ignored, safe = None, target
    picked = bb.emit(relax.op.squeeze(
        relax.op.gather_elements(log_probs, relax.op.expand_dims(safe, 1), axis=1), axis=[1]))
    if weight is not None:
        per_element = bb.emit(relax.op.take(weight, safe, axis=0))
    else:
        per_element = bb.emit(relax.op.ones_like(picked))
    if ignored is not None:
        per_element = bb.emit(relax.op.where(ignored, relax.const(0, dtype), per_element))
    loss = bb.emit(relax.op.negative(relax.op.multiply(picked, per_element)))
    if reduction == "none":
        return loss
    total = bb.emit(relax.op.sum(loss))
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise InvalidModelError(f"reduction must be 'none', 'sum' or 'mean', given {reduction!r}")
    return bb.emit(relax.op.divide(total, relax.op.sum(per_element)))


def negative_log_likelihood_loss(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                                 context: ConverterContext) -> relax.Expr:
    """NegativeLogLikelihoodLoss: -input[n, target[n], ...] x weight, reduced as asked."""
    weight = inputs[2] if len(inputs) > 2 else None
    ignore = attrs.get("ignore_index")
    return _nll(bb, inputs[0], inputs[1], weight, _text(attrs.get("reduction"), "mean"),
                None if ignore is None else int(ignore))


def softmax_cross_entropy_loss(bb: relax.BlockBuilder, inputs: list[Any], attrs: dict[str, Any],
                               context: ConverterContext) -> relax.Expr:
    """SoftmaxCrossEntropyLoss: NegativeLogLikelihoodLoss of log_softmax(scores, axis=1); also log_prob."""
    log_probs = bb.emit(relax.op.nn.log_softmax(inputs[0], axis=1))
    weight = inputs[2] if len(inputs) > 2 else None
    ignore = attrs.get("ignore_index")
    loss = _nll(bb, log_probs, inputs[1], weight, _text(attrs.get("reduction"), "mean"),
                None if ignore is None else int(ignore))
    return relax.Tuple([loss, log_probs])


CONVERTERS = {
    "NegativeLogLikelihoodLoss": negative_log_likelihood_loss,
    "SoftmaxCrossEntropyLoss": softmax_cross_entropy_loss,
}
