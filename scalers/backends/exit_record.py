"""Run a command and record how it ended: ``python -I exit_record.py <status file> <argv...>``.

The bare-metal backend starts the real KiCI agent through this wrapper because the rq work horse
that spawned it is gone by the time the follow looks. The command gets this environment and stdio
unchanged; the status file gets ``0``..``255`` or ``signal N``, renamed into place whole. Exits
with the command's code (128 + N for signal N); a signal that ends the wrapper first (the group's
SIGTERM on destroy) leaves no file. Design: docs/bare-metal.md.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main(argv: list[str]) -> int:
    status_path, command = argv[0], argv[1:]
    try:
        code = subprocess.call(command)
    except OSError as exc:
        print(f"could not start {command[0]}: {exc}", file=sys.stderr, flush=True)
        code = 127
    status = f"signal {-code}" if code < 0 else str(code)
    tmp = f"{status_path}.tmp"
    with open(tmp, "w") as out:
        out.write(status + "\n")
    os.replace(tmp, status_path)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
