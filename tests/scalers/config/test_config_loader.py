"""Loading scalers.yaml files: lines, drop-ins, every problem, the example files."""

from __future__ import annotations

import glob
import os
import textwrap
from pathlib import Path

import pytest

from scalers.config.loader import (
    ConfigInvalid,
    ConfigProblem,
    drop_in_files,
    load_scalers_config,
    parse_scalers_config_text,
)
from scalers.config.schema import ScalersConfig

EXAMPLES = str(Path(__file__).resolve().parent / "examples")


def problems_of(text: str, filename: str = "scalers.yaml") -> list[ConfigProblem]:
    with pytest.raises(ConfigInvalid) as info:
        parse_scalers_config_text(textwrap.dedent(text), filename)
    return info.value.problems


def write(path, text):
    with open(path, "w") as fh:
        fh.write(textwrap.dedent(text))
    return str(path)


MAIN = """\
version: 1
globalMaxAgents: 7
scalers:
  - name: main-one
    type: container
    maxAgents: 2
    labelSets:
      - labels: [linux, main]
        image: a:1
"""


# ----------------------------------------------------------------------------- the shared examples


VALID_EXAMPLES = sorted(p for p in glob.glob(f"{EXAMPLES}/*.yaml") if not os.path.basename(p).startswith("invalid-"))


@pytest.mark.parametrize("path", VALID_EXAMPLES, ids=os.path.basename)
def test_every_valid_example_loads(path):
    config = load_scalers_config(path)
    assert isinstance(config, ScalersConfig)
    assert config.scalers


@pytest.mark.parametrize(
    "name, path, fragment",
    [
        (
            "invalid-01-container-missing-image.yaml",
            "scalers.0.labelSets.0.image",
            "Container scaler \"container-default\" label set [0] requires an 'image' field",
        ),
        (
            "invalid-02-unknown-machine-pool.yaml",
            "scalers.0.machinePool",
            'Scaler "bare-metal-builders" references unknown machinePool "shared-hots". '
            "Define it under top-level machinePools[].",
        ),
        (
            "invalid-03-gate-label-missing.yaml",
            "scalers.0.labelSets.1.labels",
            'Scaler "leaky-gate" gate label "gpu" is missing from labelSets[1].labels — ',
        ),
        (
            "invalid-04-hostaccess-hostname.yaml",
            "scalers.0.labelSets.0.networkPolicy.hostAccess",
            'which is not an IPv4 address, an IPv4 CIDR, or "*"',
        ),
        (
            "invalid-05-event-no-targets.yaml",
            "scalers.0.provisioningTargets",
            "Event scaler \"cloud\" requires a non-empty 'provisioningTargets' array (",
        ),
    ],
)
def test_every_invalid_example_fails_with_the_field_named(name, path, fragment):
    file = f"{EXAMPLES}/{name}"
    with pytest.raises(ConfigInvalid) as info:
        load_scalers_config(file)
    first = info.value.problems[0]
    assert first.file == file
    assert first.path.startswith(path)
    assert fragment in first.message
    assert first.line and first.line > 1
    assert str(first).startswith(f"{file}:{first.line}: {first.path}: ")


def test_example_values_match_the_readme():
    c1 = load_scalers_config(f"{EXAMPLES}/01-container-basic.yaml")
    assert c1.default_resources.model_dump(exclude_none=True) == {
        "requests": {"memory": "2g", "cpus": 2},
        "limits": {"memory": "2g", "cpus": 2},
    }
    assert c1.scalers[0].label_sets[0].image_pull_policy == "IfNotPresent"
    c2 = load_scalers_config(f"{EXAMPLES}/02-container-podman-remote.yaml")
    assert c2.scaler("podman-agents").max_concurrent_spawns == 2
    assert c2.scaler("container-remote").roles == ["builder"]
    c5 = load_scalers_config(f"{EXAMPLES}/05-mixed-pools-warm.yaml")
    assert c5.global_resource_cap.max_memory_bytes == 206158430208
    assert c5.machine_pool("shared-host").cap.max_memory_bytes == 137438953472
    c7 = load_scalers_config(f"{EXAMPLES}/07-event-and-platforms.yaml")
    assert c7.scaler("cloud-arm").gates == [["arm64"]]
    assert c7.scaler("macos-bare-metal").gates == [["macos", "arm64"]]
    assert c7.scaler("windows-bare-metal").gates == [["windows"]]


# ----------------------------------------------------------------------------- lines


def test_line_is_the_line_of_the_offending_key():
    (problem,) = problems_of(
        """\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 0
            labelSets:
              - labels: [linux]
                image: a
        """
    )
    assert (problem.line, problem.path) == (5, "scalers.0.maxAgents")
    assert str(problem) == "scalers.yaml:5: scalers.0.maxAgents: Input should be greater than 0, received 0"


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "Input should be greater than 0, received 0"), ("1.5", "Expected an integer, received 1.5")],
)
def test_max_uses_is_a_whole_number_of_jobs_named_with_its_line(value, message):
    (problem,) = problems_of(
        f"""\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 1
            labelSets:
              - labels: [linux]
                image: a
                maxUses: {value}
        """
    )
    assert (problem.line, problem.path) == (9, "scalers.0.labelSets.0.maxUses")
    assert message in problem.message


def test_a_missing_key_points_at_its_enclosing_item():
    (problem,) = problems_of(
        """\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 1
            labelSets:
              - labels: [linux]
                env: {A: b}
        """
    )
    assert (problem.path, problem.line) == ("scalers.0.labelSets.0.image", 7)


def test_an_unknown_key_points_at_itself():
    (problem,) = problems_of(
        """\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 1
            cleanable: true
            labelSets:
              - labels: [linux]
                image: a
        """
    )
    assert (problem.path, problem.line) == ("scalers.0.cleanable", 6)
    assert "unrecognized_keys" in problem.message


def test_a_list_item_points_at_its_own_line():
    (problem,) = problems_of(
        """\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 1
            labelSets:
              - labels:
                  - linux
                  - kici:agent:x
                image: a
        """
    )
    assert (problem.path, problem.line) == ("scalers.0.labelSets.0.labels.1", 9)


def test_cfg52_yaml_syntax_errors_carry_their_line():
    (problem,) = problems_of("version: 1\nscalers:\n  - name: [unclosed\n    type: container\n")
    assert problem.line is not None and problem.line >= 3
    assert "YAML syntax error" in problem.message


def test_duplicate_keys_are_reported():
    problems = problems_of(MAIN + "globalMaxAgents: 9\n")
    assert [(p.path, p.line) for p in problems] == [("globalMaxAgents", 10)]
    assert "first defined on line 2" in problems[0].message


def test_every_problem_is_reported_in_line_order():
    problems = problems_of(
        """\
        version: 2
        globalMaxAgents: 0
        scalers:
          - name: c
            type: docker
            maxAgents: 1
            labelSets:
              - labels: [linux]
          - name: d
            type: container
            maxAgents: 1
            labelSets:
              - labels: [x]
        """
    )
    assert [(p.line, p.path) for p in problems] == [
        (1, "version"),
        (2, "globalMaxAgents"),
        (5, "scalers.0.type"),
        (13, "scalers.1.labelSets.0.image"),
    ]


def test_an_empty_file_is_not_a_config():
    (problem,) = problems_of("")
    assert "Expected a mapping" in problem.message
    assert str(problem).startswith("scalers.yaml:0: (document): ")


def test_overlaps_and_duplicate_names_are_rejected_at_load():
    problems = problems_of(
        """\
        version: 1
        scalers:
          - name: docker-1
            type: container
            maxAgents: 1
            labelSets:
              - labels: [linux, docker]
                image: a
          - name: docker-2
            type: container
            maxAgents: 1
            labelSets:
              - labels: [Docker, linux]
                image: a
          - name: docker-1
            type: container
            maxAgents: 1
            labelSets:
              - labels: [other]
                image: a
        """
    )
    assert [(p.line, p.path, p.message) for p in problems] == [
        (
            13,
            "scalers.1.labelSets.0.labels",
            'Label set [docker,linux] overlaps between scalers "docker-1" and "docker-2"',
        ),
        (15, "scalers.2.name", 'Duplicate scaler name "docker-1" (first defined at scalers[0])'),
    ]


def test_yaml_anchors_and_merge_keys_work():
    config = parse_scalers_config_text(
        textwrap.dedent(
            """\
            version: 1
            base: &base
              type: container
              maxAgents: 3
            scalers:
              - <<: *base
                name: a
                labelSets: [{labels: [a], image: i}]
              - <<: *base
                name: b
                labelSets: [{labels: [b], image: i}]
            """
        )
    )
    assert [(s.name, s.max_agents) for s in config.scalers] == [("a", 3), ("b", 3)]


# ----------------------------------------------------------------------------- files and drop-ins


def test_a_missing_file_is_a_problem(tmp_path):
    with pytest.raises(ConfigInvalid) as info:
        load_scalers_config(str(tmp_path / "nope.yaml"))
    (problem,) = info.value.problems
    assert "cannot read file" in problem.message


def test_cfg51_drop_ins_append_only_their_scalers(tmp_path):
    main = write(tmp_path / "scalers.yaml", MAIN)
    d = tmp_path / "scalers.d"
    d.mkdir()
    write(
        d / "20-second.yml",
        """\
        scalers:
          - name: second
            type: container
            maxAgents: 1
            labelSets: [{labels: [second], image: i}]
        """,
    )
    write(
        d / "10-first.yaml",
        """\
        globalMaxAgents: 5
        machinePools: [{name: p, cap: {}}]
        scalers:
          - name: first
            type: container
            maxAgents: 1
            labelSets: [{labels: [first], image: i}]
        """,
    )
    write(d / "30-ignored.txt", "scalers: [1, 2, 3]\n")
    write(d / "40-no-scalers.yaml", "globalMaxAgents: 1\n")
    write(d / "50-not-a-list.yaml", "scalers: {name: x}\n")
    (d / "60-dir.yaml").mkdir()
    config = load_scalers_config(main, str(d))
    assert [s.name for s in config.scalers] == ["main-one", "first", "second"]
    assert config.global_max_agents == 7
    assert config.machine_pools == []
    assert drop_in_files(str(d)) == [
        str(d / n) for n in ("10-first.yaml", "20-second.yml", "40-no-scalers.yaml", "50-not-a-list.yaml")
    ]


def test_a_problem_in_a_drop_in_names_that_file_and_its_line(tmp_path):
    main = write(tmp_path / "scalers.yaml", MAIN)
    d = tmp_path / "conf.d"
    d.mkdir()
    drop = write(
        d / "a.yaml",
        """\
        # a comment line
        scalers:
          - name: fine
            type: container
            maxAgents: 1
            labelSets: [{labels: [fine], image: i}]
          - name: broken
            type: container
            maxAgents: 1
            labelSets:
              - labels: [broken]
        """,
    )
    with pytest.raises(ConfigInvalid) as info:
        load_scalers_config(main, str(d))
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == (drop, 11, "scalers.1.labelSets.0.image")


def test_an_overlap_with_a_drop_in_names_the_drop_in(tmp_path):
    main = write(tmp_path / "scalers.yaml", MAIN)
    d = tmp_path / "conf.d"
    d.mkdir()
    drop = write(
        d / "b.yaml",
        """\
        scalers:
          - name: copycat
            type: container
            maxAgents: 1
            labelSets:
              - labels: [main, linux]
                image: i
        """,
    )
    with pytest.raises(ConfigInvalid) as info:
        load_scalers_config(main, str(d))
    (problem,) = info.value.problems
    assert (problem.file, problem.line, problem.path) == (drop, 6, "scalers.0.labelSets.0.labels")
    assert problem.message == 'Label set [linux,main] overlaps between scalers "main-one" and "copycat"'


def test_a_drop_in_with_a_syntax_error_is_reported_with_the_others(tmp_path):
    main = write(tmp_path / "scalers.yaml", MAIN.replace("maxAgents: 2", "maxAgents: -2"))
    d = tmp_path / "conf.d"
    d.mkdir()
    bad = write(d / "bad.yaml", "scalers:\n  - name: [x\n")
    with pytest.raises(ConfigInvalid) as info:
        load_scalers_config(main, str(d))
    files = [p.file for p in info.value.problems]
    assert files == [main, bad]


def test_drop_ins_can_supply_every_scaler(tmp_path):
    main = write(tmp_path / "scalers.yaml", "version: 1\n")
    d = tmp_path / "conf.d"
    d.mkdir()
    write(d / "a.yaml", "scalers: [{name: a, type: container, maxAgents: 1, labelSets: [{labels: [a], image: i}]}]\n")
    assert [s.name for s in load_scalers_config(main, str(d)).scalers] == ["a"]


def test_a_missing_drop_in_directory_is_a_problem(tmp_path):
    main = write(tmp_path / "scalers.yaml", MAIN)
    with pytest.raises(ConfigInvalid) as info:
        load_scalers_config(main, str(tmp_path / "missing.d"))
    assert "cannot list drop-in directory" in info.value.problems[0].message


def test_config_invalid_message_lists_every_problem():
    with pytest.raises(ConfigInvalid) as info:
        parse_scalers_config_text("version: 3\nscalers: 5\n", "x.yaml")
    assert str(info.value).splitlines() == [str(p) for p in info.value.problems]
    assert len(info.value.problems) == 2


def test_merge_keys_overridden_in_place_are_not_duplicates():
    config = parse_scalers_config_text(
        textwrap.dedent(
            """\
            version: 1
            base: &base {type: container, maxAgents: 3}
            scalers:
              - <<: *base
                maxAgents: 4
                name: a
                labelSets: [{labels: [a], image: i}]
            """
        )
    )
    assert config.scalers[0].max_agents == 4


def test_net_raw_must_be_a_boolean_naming_file_line_and_field():
    (problem,) = problems_of(
        """\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 1
            labelSets:
              - labels: [linux]
                image: a
                netRaw: "yes"
        """,
        "raw.yaml",
    )
    assert (problem.file, problem.line, problem.path) == ("raw.yaml", 9, "scalers.0.labelSets.0.netRaw")
    assert str(problem) == 'raw.yaml:9: scalers.0.labelSets.0.netRaw: Expected true or false, received "yes"'


@pytest.mark.parametrize(
    ("entry", "line", "path", "says"),
    [
        ('debugHold: {onFailure: "yes"}', 9, "debugHold.onFailure", 'Expected true or false, received "yes"'),
        (
            "debugHold: {onFailure: true, durationSeconds: 30}",
            9,
            "debugHold.durationSeconds",
            "greater than or equal to 60",
        ),
        ("debugHold: {durationSeconds: 90000}", 9, "debugHold.durationSeconds", "less than or equal to 86400"),
        ("debugHold: {durationSeconds: 2h}", 9, "debugHold.durationSeconds", 'Expected an integer, received "2h"'),
        ("debugHold: {onFailure: true, keep: 1}", 9, "debugHold.keep", 'Unrecognized key "keep"'),
        ("debugHold: true", 9, "debugHold", "Expected a mapping, received true"),
    ],
)
def test_debug_hold_is_checked_naming_file_line_and_field(entry, line, path, says):
    (problem,) = problems_of(
        f"""\
        version: 1
        scalers:
          - name: c
            type: container
            maxAgents: 1
            labelSets:
              - labels: [linux]
                image: a
                {entry}
        """,
        "holds.yaml",
    )
    assert (problem.file, problem.line, problem.path) == ("holds.yaml", line, f"scalers.0.labelSets.0.{path}")
    assert says in problem.message, problem.message


def test_a_debug_hold_defaults_to_two_hours_on_failure_off():
    config = parse_scalers_config_text(
        textwrap.dedent(
            """\
            version: 1
            scalers:
              - name: c
                type: container
                maxAgents: 1
                labelSets:
                  - labels: [linux]
                    image: a
                    debugHold: {onFailure: true}
                  - labels: [other]
                    image: a
                    debugHold: {}
            """
        ),
        "scalers.yaml",
    )
    held, plain = config.scalers[0].label_sets
    assert (held.debug_hold.on_failure, held.debug_hold.duration_seconds) == (True, 7200)
    assert (plain.debug_hold.on_failure, plain.debug_hold.duration_seconds) == (False, 7200)
