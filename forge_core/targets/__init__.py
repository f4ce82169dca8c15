"""Targets: parsing every form ``compile(target=...)`` accepts, and the tag listings."""

from forge_core.targets.parsing import resolve_target, target_config, target_to_string

__all__ = ["resolve_target", "target_config", "target_to_string"]
