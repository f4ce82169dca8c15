"""The docs' tag-listing functions: ``list_cuda_tags``, ``list_x86_tags``…"""

from __future__ import annotations

from forge_core.plugin_manager import TargetTag, get_plugin_manager
from forge_core.targets.parsing import resolve_target, target_to_string


def tags_in(category: str | None = None) -> list[TargetTag]:
    """Registered tags, optionally of one category, sorted by name."""
    tags = get_plugin_manager().target_tags().values()
    return sorted((t for t in tags if category is None or t.category == category), key=lambda t: t.name)


def tag_target_string(tag: TargetTag) -> str:
    """The docs-style target string a tag stands for, host included.

    A tag registered with a string gives that string back as written.
    """
    if isinstance(tag.target, str) and not tag.target.lstrip().startswith("{"):
        return tag.target
    target = resolve_target(tag.name)
    text = target_to_string(target)
    if target.host is not None and target.kind.name != "llvm":
        text += f" -host='{target_to_string(target.host)}'"
    return text


def _listing(category: str | None, verbose: bool) -> list[str] | list[tuple[str, str]]:
    tags = tags_in(category)
    if verbose:
        return [(t.name, tag_target_string(t)) for t in tags]
    return [t.name for t in tags]


def list_target_tags(verbose: bool = False) -> list[str] | list[tuple[str, str]]:
    """List all tags (pre-defined aliases) of all targets.

    Args:
        verbose: A flag to return all the tags with their corresponding target
            string literals for the TVM compiler if true. Default is False.

    Returns:
        A list of tags, or of ``(tag, target string)`` pairs when ``verbose``.
    """
    return _listing(None, verbose)


def list_cuda_tags(verbose: bool = False) -> list[str] | list[tuple[str, str]]:
    """List all tags (pre-defined aliases) of CUDA targets.

    Args:
        verbose: A flag to return all the tags with their corresponding target
            string literals for the TVM compiler if true. Default is False.

    Returns:
        A list of tags, or of ``(tag, target string)`` pairs when ``verbose``.
    """
    return _listing("cuda", verbose)


def list_x86_tags(verbose: bool = False) -> list[str] | list[tuple[str, str]]:
    """List all tags (pre-defined aliases) of x86 targets.

    Args:
        verbose: A flag to return all the tags with their corresponding target
            string literals for the TVM compiler if true. Default is False.

    Returns:
        A list of tags, or of ``(tag, target string)`` pairs when ``verbose``.
    """
    return _listing("x86", verbose)


def list_arm_tags(verbose: bool = False) -> list[str] | list[tuple[str, str]]:
    """List all tags (pre-defined aliases) of ARM targets.

    Args:
        verbose: A flag to return all the tags with their corresponding target
            string literals for the TVM compiler if true. Default is False.

    Returns:
        A list of tags, or of ``(tag, target string)`` pairs when ``verbose``.
    """
    return _listing("arm", verbose)


def list_android_tags(verbose: bool = False) -> list[str] | list[tuple[str, str]]:
    """List all tags (pre-defined aliases) for Android targets.

    Args:
        verbose: A flag to return all the tags with their corresponding target
            string literals for the TVM compiler if true. Default is False.

    Returns:
        A list of tags, or of ``(tag, target string)`` pairs when ``verbose``.
    """
    return _listing("android", verbose)
