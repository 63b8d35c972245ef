"""The real-KiCI build cache (tests/support/kici_real.ensure_build) with a stand-in build script:
keyed by bundle and script, built once, rebuilt when unfinished, failing with the log's tail."""

from __future__ import annotations

import threading

import pytest

from tests.support.kici_real import KiciRealBuildError, build_key, ensure_build

#: Counts its runs in OUT/../runs, logs a line, and finishes (BUILT) unless the bundle says "fail".
SCRIPT = """set -e
echo run >> "$(dirname "$2")/runs"
echo "building $1"
if grep -q fail "$1"; then echo "the last words of a failed build"; exit 3; fi
sleep 0.3
mkdir -p "$2" && touch "$2/BUILT"
"""


@pytest.fixture
def stand_in(tmp_path):
    bundle = tmp_path / "kici.bundle"
    bundle.write_text("a bundle")
    script = tmp_path / "build.sh"
    script.write_text(SCRIPT)
    return tmp_path / "cache", bundle, script


def _runs(cache) -> int:
    return len((cache / "runs").read_text().splitlines()) if (cache / "runs").exists() else 0


def test_it_builds_once_under_the_lock_and_then_reuses_the_build(stand_in):
    cache, bundle, script = stand_in
    results = []
    threads = [threading.Thread(target=lambda: results.append(ensure_build(cache, bundle, script))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert _runs(cache) == 1
    assert {build.root for build in results} == {cache / build_key(bundle, script)}
    ensure_build(cache, bundle, script)
    assert _runs(cache) == 1


def test_a_new_bundle_or_script_builds_afresh(stand_in):
    cache, bundle, script = stand_in
    first = ensure_build(cache, bundle, script)
    script.write_text(SCRIPT + "# the harness's next version\n")
    second = ensure_build(cache, bundle, script)
    bundle.write_text("another bundle")
    third = ensure_build(cache, bundle, script)
    assert len({first.root, second.root, third.root}) == 3
    assert _runs(cache) == 3


def test_an_unfinished_build_is_redone(stand_in):
    cache, bundle, script = stand_in
    unfinished = cache / build_key(bundle, script)
    (unfinished / "half").mkdir(parents=True)
    build = ensure_build(cache, bundle, script)
    assert build.root == unfinished and (build.root / "BUILT").exists()
    assert not (build.root / "half").exists()


def test_a_failed_build_raises_with_the_tail_of_its_log(stand_in):
    cache, bundle, script = stand_in
    bundle.write_text("fail")
    with pytest.raises(KiciRealBuildError, match="the last words of a failed build"):
        ensure_build(cache, bundle, script)
