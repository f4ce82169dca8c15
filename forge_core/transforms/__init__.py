"""Module-level transforms that users run by name: batch size, tensor splitting (registered passes)."""
