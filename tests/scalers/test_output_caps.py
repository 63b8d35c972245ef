"""The sweeper's output cap on a bare-metal agent's output file, and the archive it leaves."""

from __future__ import annotations

import os

import pytest

from agents.archive import archived_lines
from consolelog.cap import data_start
from operations.management.commands.scaler_sweeper import Command
from scalers.backends.baremetal import BareMetalBackend
from scalers.output_caps import cap_agent_outputs
from tests.support.scalers import make_scaler

CAP = 64 * 1024
LINE = "output line {:06d}\n"


@pytest.mark.django_db
def test_the_sweeper_caps_a_process_output_and_the_archive_keeps_its_last_lines_in_order(settings, tmp_path):
    settings.KICI_AGENT_LOG_DIR = str(tmp_path)
    settings.KICI_AGENT_OUTPUT_CAP_BYTES = CAP
    make_scaler(type="bare-metal", ls_config={"binaryPath": "/bin/true"})
    path = tmp_path / "agent-1.log"
    with open(path, "ab") as out:  # O_APPEND, as the spawn opens it
        out.write(b"".join(LINE.format(i).encode() for i in range(20000)))
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * (2 * CAP))
    (tmp_path / "planted.log").symlink_to(victim)

    assert Command().handle_output_caps() is True
    assert victim.read_bytes() == b"x" * (2 * CAP)  # a link in the directory is not followed
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        assert st.st_size == 20000 * len(LINE.format(0))
        assert st.st_size - data_start(fd) <= CAP // 2 + st.st_blksize  # the block the cut is in
    finally:
        os.close(fd)
    assert cap_agent_outputs(CAP) == 0  # under the cap now

    BareMetalBackend._archive("agent-1", str(path))
    lines = archived_lines("agent-1", limit=10**6).lines
    assert lines[0] == "--- process output ---"
    kept = [int(line.split()[2]) for line in lines[1:]]
    assert kept == list(range(kept[0], 20000)) and kept[0] > 0
