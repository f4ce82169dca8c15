"""Forge's intermediate representation."""
