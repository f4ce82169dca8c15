"""Watch the disk while the runtime loads a library: ``python plaintext_watch.py PLAN.json``.

The plan gives the artifact, its key and password (or none), the first bytes
of the plaintext library (its ELF header), and the directories to watch:
the temporary directory, the working directory and the artifact's directory.
inotify watches them (and every directory below them) from just before the
load until after the first inference; then every file under them is scanned
for the ELF header. Prints one JSON line: the files created or written, and
the files holding the header.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
from inotify_simple import INotify
from inotify_simple import flags as f

from forge_core.runtime import Runtime

WATCHED = f.CREATE | f.MODIFY | f.CLOSE_WRITE | f.MOVED_TO


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    header = bytes.fromhex(plan["elf_header"])
    roots = [Path(d) for d in plan["watch"]]
    notify = INotify()
    directories: dict[int, Path] = {}
    for root in roots:
        for directory, _, _ in os.walk(root):
            directories[notify.add_watch(directory, WATCHED)] = Path(directory)
    runtime = Runtime(plan["library"], plan.get("key"), plan.get("password"))
    runtime.infer(*runtime.example_inputs())
    events = []
    for event in notify.read(timeout=200):
        events.append({"path": str(directories.get(event.wd, Path("?")) / event.name),
                       "flags": [str(flag) for flag in f.from_mask(event.mask)]})
    holding = []
    for root in roots:
        for directory, _, files in os.walk(root):
            for name in files:
                path = Path(directory) / name
                try:
                    if header in path.read_bytes():
                        holding.append(str(path))
                except OSError:
                    pass
    print(json.dumps({"events": events, "holding": holding, "tmp": os.environ.get("TMPDIR"), "cwd": os.getcwd()}))


if __name__ == "__main__":
    main()
