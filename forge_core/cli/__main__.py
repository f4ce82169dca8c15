"""``python -m forge_core.cli``: the ``forge`` command."""

from forge_core.cli import main

raise SystemExit(main())
