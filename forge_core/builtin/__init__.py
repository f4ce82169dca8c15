"""forge_core's built-in plugins.

Each module here is a plugin, registered by the plugin manager before any
external one and in exactly the same way.
"""
