"""Opening below a trusted directory without following links (``lib.safe_open``)."""

from __future__ import annotations

import os

import pytest

from lib.safe_open import UnsafePathError, open_beneath, open_last


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "vm" / "root").mkdir(parents=True)
    (tmp_path / "vm" / "root" / "log").write_text("guest line\n")
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$secret\n")
    return tmp_path, secret


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 100)
    finally:
        os.close(fd)


def test_it_opens_a_regular_file_below_the_top(tree):
    top, _ = tree
    assert _read(open_beneath(top, ["vm", "root", "log"], os.O_RDONLY)) == b"guest line\n"
    assert _read(open_last(top / "vm" / "root" / "log", 3, os.O_RDONLY)) == b"guest line\n"


def test_it_refuses_a_link_in_place_of_the_file_and_names_it(tree):
    top, secret = tree
    (top / "vm" / "root" / "log").unlink()
    (top / "vm" / "root" / "log").symlink_to(secret)
    with pytest.raises(UnsafePathError, match=r"refusing to open .*/vm/root/log: .*/vm/root/log is a symbolic link"):
        open_beneath(top, ["vm", "root", "log"], os.O_WRONLY | os.O_APPEND)
    assert secret.read_text() == "root:$6$secret\n"


def test_it_refuses_a_link_in_place_of_a_directory(tree):
    top, secret = tree
    elsewhere = top / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "log").symlink_to(secret)  # not even reached: the directory link is refused first
    os.rename(top / "vm" / "root", top / "vm" / "old")
    (top / "vm" / "root").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match=r"/vm/root is a symbolic link"):
        open_beneath(top, ["vm", "root", "log"], os.O_RDONLY)


def test_creating_over_a_dangling_link_creates_nothing_where_it_points(tree):
    top, _ = tree
    target = top / "created-by-root"
    (top / "vm" / "root" / "new").symlink_to(target)
    with pytest.raises(UnsafePathError, match="is a symbolic link"):
        open_beneath(top, ["vm", "root", "new"], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    assert not target.exists()


def test_a_fifo_is_refused_instead_of_blocking_the_reader(tree):
    top, _ = tree
    os.mkfifo(top / "vm" / "root" / "pipe")
    with pytest.raises(UnsafePathError, match="not a regular file"):
        open_beneath(top, ["vm", "root", "pipe"], os.O_RDONLY)


@pytest.mark.parametrize("parts", [[], ["vm", ".."], ["vm/root"], [""]])
def test_it_refuses_components_that_are_not_single_names(tree, parts):
    top, _ = tree
    with pytest.raises(ValueError, match="single names"):
        open_beneath(top, parts, os.O_RDONLY)
