"""YAML files as freshroll reads them: UTF-8 text, each mapping key once, one-line errors.

:func:`read_yaml_file` reads a config, a chaos plan or an acceptance file; :func:`parse_yaml`
an override's value. Every failure is a :class:`~freshroll.errors.ConfigError` that names
the file (or the override) and says what is wrong:

* the file cannot be read (missing, a directory, no permission);
* it is not UTF-8 text (random bytes, a binary): the byte offset is named;
* it is not YAML (the parser's message);
* a mapping holds one key twice (:class:`UniqueKeyLoader`; PyYAML's ``SafeLoader`` keeps the
  last value silently): the key and both lines are named.

Loading is safe (a ``SafeLoader``: plain data only, no Python objects).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from freshroll.errors import ConfigError


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A YAML mapping holds the same key twice."""

    def __init__(self, key: Any, node: yaml.Node, first: yaml.Node) -> None:
        super().__init__(None, None, f"duplicate key {key!r}", node.start_mark)
        self.key = key
        self.line, self.first_line = node.start_mark.line + 1, first.start_mark.line + 1


class UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, except that a mapping holding one key twice is an error (the
    SafeLoader keeps the last value silently). Keys a merge (``<<: *anchor``) brings in may
    still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the SafeLoader says so below
                continue
            if first is not key_node:
                raise DuplicateKeyError(key, key_node, first)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> Any:
    """``text`` as YAML (:class:`UniqueKeyLoader`); a ConfigError starting ``source``."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except DuplicateKeyError as exc:
        raise ConfigError(f"{source}: duplicate key {exc.key!r} at line {exc.line} (first at "
                          f"line {exc.first_line}); give each key once") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None


#: libyaml's loader and dumper where PyYAML was built with it (5-8x faster than the pure-Python
#: ones, the same data and, for the plain data freshroll writes, the same text), else PyYAML's
_FAST_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FAST_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def load_plain(text: str) -> Any:
    """YAML that freshroll wrote itself (``config.yaml``) as plain data: a safe loader, fast;
    a user's file goes through :func:`parse_yaml` (duplicate keys, messages naming it)."""
    return yaml.load(text, Loader=_FAST_LOADER)


def dump_plain(data: Any) -> str:
    """Plain data as block YAML in the order given (a safe dumper, fast)."""
    text: str = yaml.dump(data, Dumper=_FAST_DUMPER, sort_keys=False)
    return text


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """The YAML document of the file ``path``: a ConfigError names the file when it cannot
    be read, is not UTF-8 text (random bytes, a binary) or not YAML (``what``: the file's
    role in the message)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not a YAML {what}: not UTF-8 text (byte {exc.start} is "
                          f"{raw[exc.start]:#04x})") from None
    return parse_yaml(text, str(p))


__all__ = ["DuplicateKeyError", "UniqueKeyLoader", "dump_plain", "load_plain", "parse_yaml",
           "read_yaml_file"]
