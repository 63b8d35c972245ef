"""Load ``scalers.yaml`` (plus drop-ins) and report every problem with file and line; the schema
rules, the cross-scaler label-set overlap check included, are :mod:`scalers.config.schema`'s.
Every problem is one :class:`ConfigProblem`, ``FILE:LINE: dotted.path: message``: LINE is the
offending key's (from the PyYAML node tree), or the nearest enclosing key's for a missing one; a
YAML syntax error carries its own; a problem in a drop-in's scaler names that file, its line and
the path inside it (``scalers.<index in that file>...``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import yaml

from .schema import ScalersConfig, SchemaIssue, validate_document

Path = tuple[str | int, ...]

# libyaml's parser when available (same safe constructor, about 10x faster); one pass gives
# both the node tree (for lines) and the data.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a config file.

    ``file``: the file name as given; ``line``: 1-based line or ``None`` when unknown;
    ``path``: zod-style dotted path (``scalers.0.labelSets.1.labels``, empty for the
    document itself); ``message``: what is wrong, naming the value.
    ``str(problem)`` is ``FILE:LINE: path: message`` (LINE ``0`` when unknown).
    """

    file: str
    line: int | None
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line or 0}: {self.path or '(document)'}: {self.message}"


class ConfigInvalid(Exception):
    """Raised when a config cannot be loaded; ``problems`` lists every problem found."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


# --------------------------------------------------------------------------- YAML reading


@dataclass
class _ParsedFile:
    """One YAML file: the data, the line of every key/item, and duplicate-key problems."""

    filename: str
    data: Any = None
    lines: dict[Path, int] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)
    syntax_error: bool = False


def _scalar_key(node: yaml.Node) -> str | int | None:
    if isinstance(node, yaml.ScalarNode):
        return node.value
    return None


def _walk(node: yaml.Node, path: Path, out: _ParsedFile) -> None:
    if isinstance(node, yaml.MappingNode):
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = _scalar_key(key_node)
            line = key_node.start_mark.line + 1
            if key is None:
                continue
            if key == "<<":  # merge key: the merged keys keep the lines of their own nodes
                _walk_merge(value_node, path, out)
                continue
            if key in first_line:
                out.problems.append(
                    ConfigProblem(
                        out.filename,
                        line,
                        ".".join(str(p) for p in (*path, key)),
                        f'Duplicate key "{key}" (first defined on line {first_line[key]})',
                    )
                )
            else:
                first_line[key] = line
            out.lines[(*path, key)] = line
            _walk(value_node, (*path, key), out)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            out.lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), out)


def _walk_merge(node: yaml.Node, path: Path, out: _ParsedFile) -> None:
    nodes = node.value if isinstance(node, yaml.SequenceNode) else [node]
    for merged in nodes:
        if isinstance(merged, yaml.MappingNode):
            for key_node, value_node in merged.value:
                key = _scalar_key(key_node)
                if key is None or (*path, key) in out.lines:
                    continue
                out.lines[(*path, key)] = key_node.start_mark.line + 1
                _walk(value_node, (*path, key), out)


def _parse_yaml(text: str, filename: str) -> _ParsedFile:
    parsed = _ParsedFile(filename)
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is not None:
            # Walk before constructing: the constructor flattens merge keys in place.
            _walk(root, (), parsed)
            parsed.data = loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        detail = " ".join(part for part in (exc.context, exc.problem) if part)
        parsed.problems.append(ConfigProblem(filename, line, "", f"YAML syntax error: {detail or exc}"))
        parsed.syntax_error = True
        return parsed
    except yaml.YAMLError as exc:
        parsed.problems.append(ConfigProblem(filename, None, "", f"YAML error: {exc}"))
        parsed.syntax_error = True
        return parsed
    finally:
        loader.dispose()
    return parsed


def _read(path: str) -> tuple[str | None, ConfigProblem | None]:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(), None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return None, ConfigProblem(path, None, "", f"cannot read file: {reason}")


def drop_in_files(drop_in_dir: str) -> list[str]:
    """Paths of the drop-in files of ``drop_in_dir``: regular files whose names end in
    ``.yaml`` or ``.yml``, in plain lexicographic order of their names.
    Raises ``OSError`` if the directory cannot be listed."""
    names = sorted(n for n in os.listdir(drop_in_dir) if n.endswith((".yaml", ".yml")))
    paths = [os.path.join(drop_in_dir, n) for n in names]
    return [p for p in paths if os.path.isfile(p)]


# --------------------------------------------------------------------------- mapping issues to lines


@dataclass(frozen=True)
class _Origin:
    parsed: _ParsedFile
    prefix: Path  # where the merged subtree sits in that file


def _line_for(parsed: _ParsedFile, path: Path) -> int | None:
    for end in range(len(path), 0, -1):
        line = parsed.lines.get(path[:end])
        if line is not None:
            return line
    return None


def _problem_for(issue: SchemaIssue, main: _ParsedFile, scaler_origins: list[_Origin]) -> ConfigProblem:
    path = issue.path
    parsed, local = main, path
    if len(path) >= 2 and path[0] == "scalers" and isinstance(path[1], int) and path[1] < len(scaler_origins):
        origin = scaler_origins[path[1]]
        parsed, local = origin.parsed, (*origin.prefix, *path[2:])
    line = _line_for(parsed, local)
    return ConfigProblem(parsed.filename, line, ".".join(str(p) for p in local), issue.message)


def _sort_key(files: list[str]):
    order = {name: i for i, name in enumerate(files)}

    def key(problem: ConfigProblem):
        return (order.get(problem.file, len(order)), problem.line or 0)

    return key


# --------------------------------------------------------------------------- public API


def _load(main: _ParsedFile, drop_ins: list[_ParsedFile], extra: list[ConfigProblem]) -> ScalersConfig:
    problems: list[ConfigProblem] = list(extra) + main.problems
    for d in drop_ins:
        problems += d.problems
    if main.syntax_error:
        # The main file did not parse at all: nothing more can be said about it.
        raise ConfigInvalid(sorted(problems, key=_sort_key([main.filename] + [d.filename for d in drop_ins])))

    data = main.data
    scaler_origins: list[_Origin] = []
    merged: list[Any] | None = None
    if isinstance(data, dict):
        if isinstance(data.get("scalers"), list):
            merged = list(data["scalers"])
            scaler_origins = [_Origin(main, ("scalers", i)) for i in range(len(merged))]
        elif "scalers" not in data:
            merged = []
    if merged is not None:
        for d in drop_ins:
            if isinstance(d.data, dict) and isinstance(d.data.get("scalers"), list):
                for j, entry in enumerate(d.data["scalers"]):
                    merged.append(entry)
                    scaler_origins.append(_Origin(d, ("scalers", j)))
        if "scalers" in data or scaler_origins:
            data = {**data, "scalers": merged}

    config, issues = validate_document(data)
    problems += [_problem_for(issue, main, scaler_origins) for issue in issues]
    if problems:
        raise ConfigInvalid(sorted(problems, key=_sort_key([main.filename] + [d.filename for d in drop_ins])))
    assert config is not None
    return config


def parse_scalers_config_text(text: str, filename: str = "<string>") -> ScalersConfig:
    """Parse and validate one ``scalers.yaml`` text (no drop-ins).

    Returns a valid :class:`~scalers.config.schema.ScalersConfig`; raises
    :class:`ConfigInvalid` listing every problem (``filename`` is used in them).
    """
    return _load(_parse_yaml(text, filename), [], [])


def load_scalers_config(path: str, drop_in_dir: str | None = None) -> ScalersConfig:
    """Load the main config file and the drop-ins of ``drop_in_dir``: its ``*.yaml``/``*.yml`` regular
    files in lexicographic order, of which only the top-level ``scalers`` list is appended (every
    other key is ignored); the merged document is validated once. Raises :class:`ConfigInvalid` with
    every problem: unreadable files, YAML syntax, the schema, duplicate names, label-set overlaps.
    """
    extra: list[ConfigProblem] = []
    text, problem = _read(path)
    if problem is not None:
        raise ConfigInvalid([problem])
    assert text is not None, "_read gives text or a problem"
    main = _parse_yaml(text, path)
    drop_ins: list[_ParsedFile] = []
    if drop_in_dir is not None:
        try:
            files = drop_in_files(drop_in_dir)
        except OSError as exc:
            extra.append(ConfigProblem(drop_in_dir, None, "", f"cannot list drop-in directory: {exc.strerror or exc}"))
            files = []
        for f in files:
            text, problem = _read(f)
            if problem is not None:
                extra.append(problem)
                continue
            assert text is not None, "_read gives text or a problem"
            drop_ins.append(_parse_yaml(text, f))
    return _load(main, drop_ins, extra)
