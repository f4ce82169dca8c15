"""The options of ``IRModule.compile()``, validated before any work starts."""

from __future__ import annotations

import os
import uuid as uuid_lib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_core.settings import COMPILE_DEFAULTS as _C
from forge_core.errors import OptionError

CHANNEL_LAYOUTS = {"first": ("NCHW", "OIHW"), "last": ("NHWC", "OHWI")}

OPT_LEVELS = {
    0: "lower every operator on its own: no fusion, no compile-time folding",
    1: "+ operator fusion (FuseOps, FuseTIR)",
    2: "+ compile-time constant folding, common-subexpression and dead-code elimination",
    3: "+ inference simplifications (dropout removed, norms decomposed) and vectorizable exp/erf/tanh/softmax approximations (a few ulps); the default",
    4: "+ LLVM fast-math flags that keep infinities and NaN (reassociation, FMA contraction; results may differ in the last bits)",
}
"""What each ``opt_level`` does; every level includes the ones below it."""


@dataclass(frozen=True)
class CompileOptions:
    """Validated ``compile()`` options (everything but the target)."""

    output_path: Path
    opt_level: int = _C.opt_level
    set_float16: bool = _C.set_float16
    set_channel_layout: str | None = _C.set_channel_layout
    export_relay: bool = _C.export_relay
    export_metadata: bool = _C.export_metadata
    force_overwrite: bool = _C.force_overwrite
    uuid: str = ""
    encrypt_password: bytes | None = field(default=None, repr=False)
    """The password as scrypt takes it (NFC, UTF-8), or None for a plain library."""

    @property
    def encrypted(self) -> bool:
        return self.encrypt_password is not None

    @classmethod
    def validate(
        cls,
        *,
        output_path: str | os.PathLike[str] | None = None,
        opt_level: Any = _C.opt_level,
        set_float16: Any = _C.set_float16,
        set_channel_layout: Any = _C.set_channel_layout,
        export_relay: Any = _C.export_relay,
        export_metadata: Any = _C.export_metadata,
        force_overwrite: Any = _C.force_overwrite,
        uuid: Any = _C.uuid,
        encrypt_password: Any = _C.encrypt_password,
    ) -> CompileOptions:
        """Check the user's options (keyword-only) and return them; ``ValueError`` names a bad one."""
        password = None
        if encrypt_password is not None:
            from forge_core.security.passwords import check_password

            password = check_password(encrypt_password)
        if isinstance(opt_level, bool) or not isinstance(opt_level, int) or opt_level not in OPT_LEVELS:
            raise OptionError(f"opt_level must be an integer from 0 to 4, given {opt_level!r}")
        if set_channel_layout not in (None, *CHANNEL_LAYOUTS):
            raise OptionError(f"set_channel_layout must be 'first', 'last' or None, given {set_channel_layout!r}")
        if output_path is None:
            output_path = _C.output_path or "./compile_output"
        if uuid is None:
            uuid_text = str(uuid_lib.uuid4())
        else:
            try:
                uuid_text = str(uuid_lib.UUID(str(uuid)))
            except ValueError:
                raise OptionError(
                    f"uuid must be a UUID such as '123e4567-e89b-12d3-a456-426614174000', given {uuid!r}"
                ) from None
        for name, value in (("set_float16", set_float16), ("export_relay", export_relay),
                            ("export_metadata", export_metadata), ("force_overwrite", force_overwrite)):
            if not isinstance(value, bool):
                raise OptionError(f"{name} must be True or False, given {value!r}")
        return cls(
            output_path=Path(output_path),
            opt_level=opt_level,
            set_float16=set_float16,
            set_channel_layout=set_channel_layout,
            export_relay=export_relay,
            export_metadata=export_metadata,
            force_overwrite=force_overwrite,
            uuid=uuid_text,
            encrypt_password=password,
        )
