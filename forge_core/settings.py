"""The user's settings of ``compile()``/``tune()`` and ``quantize()``: each option named once, with one default.

:class:`CompileSettings` and :class:`QuantizeSettings` are the single source
of the options' names, defaults and one-line help. The API signatures
(``IRModule.compile``, ``IRModule.tune``, ``IRModule.quantize``,
``ONNXModule.quantize``), the option validation
(:class:`forge_core.compiler.options.CompileOptions`) and the ``forge``
command's flags read their defaults from :data:`COMPILE_DEFAULTS` and
:data:`QUANTIZE_DEFAULTS`; ``tests/test_settings.py`` checks that every
signature agrees.

Pure Python: importing this module imports neither TVM nor numpy.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from forge_core.errors import OptionTypeError

ACTIVATION_DTYPES = ("int8", "uint8")
"""The dtypes quantized activations and kernels take."""

CALIB_METHODS = ("average", "entropy", "minmax", "percentile", "mse")
"""``calib_method`` values: the seed's four and Forge's ``"mse"``."""

QUANT_TYPES = ("static", "dynamic", "any")
"""``quant_type`` values."""


@dataclass(frozen=True)
class CompileSettings:
    """``compile()``'s options after ``target``, with their defaults (see ``IRModule.compile``)."""

    host: str | Mapping[str, Any] | None = None
    """The host target of a GPU target; None: this machine."""
    output_path: str | os.PathLike[str] | None = "./compile_output"
    """The artifact directory."""
    opt_level: int = 3
    """0 to 4 (``forge_core.compiler.options.OPT_LEVELS``)."""
    set_float16: bool = False
    """float16 storage, float32 accumulation."""
    set_channel_layout: str | None = None
    """``"first"`` (NCHW), ``"last"`` (NHWC) or None: the model's own."""
    export_relay: bool = False
    """Also write ``model_relay.txt``."""
    export_metadata: bool = False
    """Also write ``model_metadata.json``."""
    force_overwrite: bool = False
    """Replace a non-empty ``output_path``."""
    uuid: str | None = None
    """The artifact's UUID; None: a random one."""
    encrypt_password: str | None = None
    """Encrypt the library with a key sealed by this password."""
    shape_buckets: Sequence[Mapping[str, Sequence[int]]] | None = None
    """Static copies of a dynamic model for these exact input shapes."""


COMPILE_DEFAULTS = CompileSettings()
"""Every compile option's one default."""

COMPILE_POSITIONAL = ("host", "output_path", "opt_level", "set_float16", "set_channel_layout", "export_relay",
                      "export_metadata", "force_overwrite", "uuid", "encrypt_password")
"""The order the documented ``compile()`` signature gave its options in (positional use is deprecated)."""


@dataclass(frozen=True)
class QuantizeSettings:
    """``quantize()``'s options, with their defaults (see ``IRModule.quantize``)."""

    activation_dtype: str = "int8"
    """One of :data:`ACTIVATION_DTYPES`."""
    kernel_dtype: str | None = None
    """One of :data:`ACTIVATION_DTYPES`; None: the activation dtype."""
    bias_dtype: str | None = None
    """None: int32 (static), float (dynamic)."""
    per_channel: bool = False
    """One kernel scale per output channel."""
    calib_method: str = "average"
    """One of :data:`CALIB_METHODS`."""
    quant_type: str = "any"
    """One of :data:`QUANT_TYPES`."""
    exclude: Iterable[str] = ()
    """Node names kept float."""
    percentile: float = 99.0
    """The cut-off of the ``"percentile"`` method."""


QUANTIZE_DEFAULTS = QuantizeSettings()
"""Every quantize option's one default."""


def field_names(settings: type) -> tuple[str, ...]:
    """The option names of a settings class, in order."""
    return tuple(f.name for f in fields(settings))


F = TypeVar("F", bound=Callable[..., Any])


def keyword_only_after(*names: str, since: str = "0.2") -> Callable[[F], F]:
    """Accept ``names`` by position for one more release, with a :class:`DeprecationWarning`.

    The decorated function declares them keyword-only; a call that still
    passes them by position (after the function's own positional parameters)
    gets them mapped to their names, in the order of ``names``, and a warning
    that says how to write the call.
    """

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        positional = [p for p in signature.parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        qualname = func.__qualname__

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            extra = args[len(positional):]
            if not extra:
                return func(*args, **kwargs)
            if len(extra) > len(names):
                raise OptionTypeError(f"{qualname}() takes at most {len(positional) + len(names)} positional arguments "
                                      f"({len(args)} given)")
            given = names[:len(extra)]
            for name in given:
                if name in kwargs:
                    raise OptionTypeError(f"{qualname}() got multiple values for argument {name!r}")
            example = ", ".join(f"{name}=..." for name in given)
            warnings.warn(
                f"Passing {', '.join(given)} to {qualname}() by position is deprecated since Forge {since} and "
                f"will raise TypeError in the next release; pass them by keyword: {qualname.rsplit('.', 1)[-1]}"
                f"(target, {example}).",
                DeprecationWarning,
                stacklevel=2,
            )
            kwargs.update(zip(given, extra))
            return func(*args[:len(positional)], **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


__all__ = [
    "ACTIVATION_DTYPES", "CALIB_METHODS", "QUANT_TYPES", "CompileSettings", "COMPILE_DEFAULTS",
    "COMPILE_POSITIONAL", "QuantizeSettings", "QUANTIZE_DEFAULTS", "field_names", "keyword_only_after",
]
