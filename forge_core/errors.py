"""Exceptions raised by Forge.

Every error Forge raises on bad input derives from :class:`ForgeError`, and its
message names what is wrong: the operator, the node, the input, the expected
and the given value, or the plugin to install.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class ForgeError(Exception):
    """Base class of Forge's errors."""


class PluginError(ForgeError):
    """A plugin is missing, broken or conflicts with another one."""


class PluginResultError(PluginError, TypeError):
    """A plugin's callable returned something of the wrong type (a pass that returned no ``tvm.IRModule``,
    a loader that returned no ``forge.IRModule``). The message names the plugin, the callable and both types."""

    def __init__(self, plugin: str, what: str, expected: str, given: object):
        self.plugin = plugin
        self.what = what
        self.expected = expected
        self.given = type(given).__name__
        super().__init__(f"{what} from plugin {plugin!r} returned {self.given}, not {expected}")


class PluginNotInstalledError(PluginError, ImportError):
    """A frontend, pass or exporter was asked for, and no installed plugin provides it.

    It is also an :class:`ImportError`, as a missing optional dependency is.
    """

    def __init__(self, kind: str, name: str, extra: str | None = None, available: Sequence[str] = ()):
        self.kind = kind
        self.name = name
        self.extra = extra
        hint = (
            f" Install it with: pip install 'forge-core[{extra}]'"
            if extra
            else ""
        )
        have = f" Installed {kind}s: {', '.join(sorted(available))}." if available else ""
        super().__init__(f"No installed Forge plugin provides the {kind} {name!r}.{hint}{have}")


class PluginConflictError(PluginError):
    """Two plugins registered the same name."""

    def __init__(self, kind: str, name: str, first: str, second: str):
        self.kind = kind
        self.name = name
        self.plugins = (first, second)
        super().__init__(
            f"The {kind} {name!r} is registered by two plugins: {first!r} and {second!r}. "
            "Uninstall one of them, or narrow the loaded plugins with FORGE_PLUGINS."
        )


class ModelImportError(ForgeError, ValueError):
    """A model could not be turned into an IRModule."""


class InvalidModelError(ModelImportError):
    """The model breaks its format's rules: a corrupt or truncated file, a value read before it is produced,
    a tensor whose data does not fill its dims, an unknown opset or element type, an attribute of the wrong
    type... The message names the node, value, field or file at fault."""


class UnsupportedOperatorError(ModelImportError):
    """A model holds operators that the frontend cannot convert.

    ``unsupported`` maps each operator type to ``(count, example_node_name)``.
    """

    def __init__(self, frontend: str, unsupported: Mapping[str, tuple[int, str]], detail: str = ""):
        self.frontend = frontend
        self.unsupported = dict(unsupported)
        lines = [
            f"  {op}: {count} node{'s' if count != 1 else ''}, e.g. {node!r}"
            for op, (count, node) in sorted(self.unsupported.items())
        ]
        total = len(self.unsupported)
        msg = (
            f"The {frontend} frontend cannot convert {total} operator type"
            f"{'s' if total != 1 else ''} in this model:\n" + "\n".join(lines)
        )
        if detail:
            msg += f"\n{detail}"
        super().__init__(msg)


class InputError(ForgeError, ValueError):
    """Inputs given to an inference function or runtime do not match the model."""


class OptionError(ForgeError, ValueError):
    """An argument of a Forge function has a value it cannot take (an ``opt_level`` of 7, an unknown
    quantization method, a negative batch size...). The message names the argument, what it takes and
    what was given."""


class OptionTypeError(ForgeError, TypeError):
    """An argument of a Forge function has a type it cannot take. The message names the argument, the
    types it takes and the one given."""


class ModelStateError(ForgeError, ValueError):
    """An operation does not apply to the module in its present state (quantizing a module not
    calibrated, editing a node the graph no longer holds...). The message says what to do first."""


class TargetError(ForgeError, ValueError):
    """A target string, dict, JSON or tag is invalid."""


class CompilationError(ForgeError):
    """Compilation failed."""


class OperatorConversionError(ModelImportError):
    """Converting one node of a model failed."""

    def __init__(self, frontend: str, op_type: str, node: str, cause: BaseException):
        self.frontend = frontend
        self.op_type = op_type
        self.node = node
        self.cause = cause
        detail = str(cause).strip().splitlines()
        summary = detail[-1] if detail else type(cause).__name__
        super().__init__(
            f"The {frontend} frontend failed to convert node {node!r} (op {op_type}): "
            f"{type(cause).__name__}: {summary}"
        )


class FileAccessError(ForgeError, OSError):
    """A file or directory Forge reads or writes could not be: missing, not writable, disk full...

    An :class:`OSError` too, with the operating system's ``errno`` and
    ``strerror``; ``filename`` is the path the caller named (the final path of
    an output, never a temporary file beside it). Its message is one line:
    ``cannot write '/out/model_library.so': No space left on device``.
    """

    def __init__(self, errno: int | None, strerror: str, filename: str, verb: str = "write"):
        super().__init__(errno, strerror, filename)
        self.verb = verb

    def __str__(self) -> str:
        return f"cannot {self.verb} {str(self.filename)!r}: {self.strerror}"

    def __reduce__(self):  # keep verb and message through pickling (multiprocessing, copy)
        return (type(self), (self.errno, self.strerror, self.filename, self.verb))

    @classmethod
    def from_os_error(cls, exc: OSError, filename: object, verb: str = "write") -> FileAccessError:
        """``exc`` (errno and its text kept) restated for ``filename``, the path the user knows."""
        if isinstance(exc, FileAccessError):
            return exc
        import os

        strerror = exc.strerror or (os.strerror(exc.errno) if exc.errno else None) or str(exc) or type(exc).__name__
        return cls(exc.errno, strerror, str(filename), verb)


class ArtifactCorruptedError(ForgeError):
    """A compiled library is truncated, modified or spliced: its bytes differ from what compile() wrote."""


class RemoteDeviceError(ForgeError):
    """A board reached through TVM's RPC tracker could not be used: no device of the key, a session that
    failed or was lost, a library the board could not load."""


class TrackerUnreachableError(RemoteDeviceError, ConnectionError):
    """The RPC tracker did not answer within the timeout: nothing listens at the address, or it is not a
    tracker."""


class DecryptionError(ForgeError):
    """An encrypted artifact could not be opened. Each case below has its own class."""


class MissingKeyError(DecryptionError):
    """The library is encrypted and no key file was given."""


class MissingPasswordError(DecryptionError):
    """A key file was given without its password."""


class WrongPasswordError(DecryptionError):
    """The key file does not open with the password: a wrong password, or a corrupted key file."""


class CorruptKeyError(DecryptionError):
    """The key file is truncated, corrupted, or not a Forge key file."""


class CorruptLibraryError(DecryptionError, ArtifactCorruptedError):
    """The encrypted library is truncated, tampered with, or corrupted (AES-GCM's tags say so)."""


class KeyMismatchError(DecryptionError):
    """The key file belongs to another artifact (its uuid or key id differs from the library's)."""


class WeakPasswordWarning(UserWarning):
    """An encryption password is short or uses one kind of character only."""


class ModelQuirkWarning(UserWarning):
    """A model deviates from its format's spec where the reference runtime accepts it, and is read as that
    runtime reads it (a ``-1`` dim as dynamic, a repeated node name made unique); the warning names each."""


class KeyIgnoredWarning(UserWarning):
    """A key file or password was given for a library that is not encrypted."""


class UnsupportedFeatureError(ForgeError, NotImplementedError):
    """Forge does not implement what was asked: a model construct a converter cannot take yet (a
    ``SequenceInsert`` position known only at run time...), or a method of a base class that its subclass
    must provide and did not."""


class GraphLookupError(ForgeError, KeyError):
    """A graph of the module, or a node of a graph, named by the caller does not exist (or no longer does,
    after an edit). The message names it and, where there are close names, suggests them."""


class MalformedDataError(ForgeError, ValueError):
    """Bytes Forge reads do not follow their format: a field of an encrypted artifact's header or key file,
    TVM's serialized modules inside a library, a calibration archive that ends early. The message names the
    field or offset at fault; callers restate it as the error of the file (:class:`CorruptLibraryError`...)."""


class ProcessFailedError(ForgeError, RuntimeError):
    """A process Forge started for part of its work (a conformance worker, the child that exports a library)
    did not start, crashed or was killed. The message names the process and how it ended."""


class ExportProcessError(ProcessFailedError, CompilationError):
    """The child process that exports (links) a library could not be set up, or died without an error to
    pass back (killed by a signal, or exited with a status); the message names the output and its last words."""


class TrackerProtocolError(RemoteDeviceError, RuntimeError):
    """Something answered at the RPC tracker's address, but not as a TVM RPC tracker does."""


class PluginDefinitionError(PluginError, RuntimeError):
    """A plugin's own tables contradict themselves (two of its converter modules define the same operator):
    a bug of the plugin, named in the message."""


class PathNotFoundError(ForgeError, FileNotFoundError):
    """A file or directory the caller named does not exist: a model, a compiled library, a key file. The
    message names the path."""


class MissingDependencyError(PluginError, ImportError):
    """A plugin is installed but a package it needs (TensorFlow, tflite...) is not; the message names the
    package and the ``pip install`` that brings it. ``name`` is the missing module, as :class:`ImportError`'s."""
