"""Run a command and record how it ended: ``python -I exit_record.py <status file> <argv...>``.

The bare-metal backend starts the real KiCI agent through this wrapper because the process that
spawned it (an rq work horse) is gone by the time the follow looks, so no one could wait for the
agent's exit code otherwise. The command gets this process's environment unchanged (Python adds no
variable), and stdin/stdout/stderr as given. The status file gets the exit code (``0``..``255``) or
``signal N`` when a signal ended it, written to ``<file>.tmp`` and renamed into place, so a reader
sees all of it or nothing. Exits with the command's code (128 + N for signal N). A signal that
ends this wrapper first (the group's SIGTERM on destroy) leaves no status file.
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
