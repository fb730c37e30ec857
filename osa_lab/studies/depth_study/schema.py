"""Strict checks of files that come from elsewhere: the experiment file (YAML) and its parts.

An experiment file may come from a colleague or a paper's supplement and starts hours of work,
so every value is checked before any work starts, and a bad one is refused on one line naming
the key and the fix (:class:`~osa_lab.errors.ConfigurationError`, exit status 2 on the command line):

* :func:`read_yaml_file`: at most :data:`MAX_FILE_BYTES`, UTF-8 text, nesting at most
  :data:`MAX_NESTING` deep, no duplicate keys, no anchors or aliases, and numbers read as YAML 1.2
  reads them (``1e-5`` and ``1e308`` are floats, not strings; ``010`` is ten, not eight; only
  ``true``/``false`` are booleans, not ``yes``/``no``/``on``/``off``).
* :class:`Int`, :class:`Real`, :class:`Choice`, :class:`PlainName`, :class:`Text`,
  :class:`Flag`, :class:`ListOf`, :class:`Bounds`: one value each — its type, its range, and an
  optional *large* bound above which the value is refused unless ``--allow-large`` is given
  (as ``osa-lab sweep`` does). A float is never taken for an int (no silent truncation).
* :func:`setting`: a dataclass field that carries its check and its documentation, so a section
  of the file is one dataclass (:class:`Section`) and :func:`check_section` checks a mapping
  against it (unknown keys refused). Adding a setting is one line in its dataclass; adding a
  section is its dataclass and one ``setting(..., Section(TheDataclass), ...)`` line.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from osa_lab.errors import ConfigurationError

#: the largest experiment file read (an experiment file is a few kB)
MAX_FILE_BYTES = 1 << 20
#: the deepest nesting of mappings and lists in an experiment file (the study's own is 4 deep)
MAX_NESTING = 16
#: no int of an experiment file is larger than this, even with ``--allow-large`` (a seed must fit torch's 64 bits)
HARD_INT_MAX = 2**63 - 1
#: the longest text value (a results path)
MAX_TEXT = 1024

_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")

ALLOW_LARGE_HINT = "pass --allow-large if you really mean it"


@dataclass(frozen=True)
class Context:
    """What a check needs beyond the value: whether ``--allow-large`` lifts the large bounds."""

    allow_large: bool = False


def _type_name(value: object) -> str:
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else repr(value)


def refuse(where: str, problem: str, fix: str) -> ConfigurationError:
    """The one-line error of a bad value: ``\\`where\\`: problem; fix``."""
    return ConfigurationError(f"`{where}`: {problem}; {fix}")


def _check_large(where: str, value: float, large: float | None, ctx: Context, unit: str = "") -> None:
    if large is not None and value > large and not ctx.allow_large:
        raise refuse(where, f"{value:g}{unit} is over the limit of {large:g}{unit}", f"lower it, or {ALLOW_LARGE_HINT}")


@dataclass(frozen=True)
class Int:
    """An int (never a bool or a float) in ``[minimum, maximum]``; above ``large`` only with ``--allow-large``."""

    minimum: int = 0
    maximum: int = HARD_INT_MAX
    large: int | None = None

    def __call__(self, value: Any, where: str, ctx: Context) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            kind = "a float" if isinstance(value, float) else f"{type(value).__name__}"
            raise refuse(where, f"must be a whole number ≥ {self.minimum}, got {_type_name(value)} ({kind})",
                         f"write it as an int, e.g. {max(self.minimum, 1)}")  # fmt: skip
        if value < self.minimum:
            raise refuse(where, f"must lie in [{self.minimum}, {self.maximum}], got {value}",
                         "give a value in that range")  # fmt: skip
        _check_large(where, value, self.large, ctx)
        if value > self.maximum:
            raise refuse(where, f"must lie in [{self.minimum}, {self.maximum}], got {value}",
                         "give a value in that range")  # fmt: skip
        return value

    def describe(self) -> str:
        top = f", over {self.large} with --allow-large" if self.large is not None else ""
        return f"int ≥ {self.minimum}{top}"


@dataclass(frozen=True)
class Real:
    """A finite number (an int is taken as a float) in ``(low, high)`` with open or closed ends."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    large: float | None = None

    def _interval(self) -> str:
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def __call__(self, value: Any, where: str, ctx: Context) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise refuse(where, f"must be a number in {self._interval()}, got {_type_name(value)}",
                         "write a plain number, e.g. 0.01 or 1e-3")  # fmt: skip
        value = float(value)
        ok = math.isfinite(value)
        ok = ok and (value > self.low if self.low_open else value >= self.low)
        ok = ok and (value < self.high if self.high_open else value <= self.high)
        if not ok:
            raise refuse(where, f"must be a finite number in {self._interval()}, got {value:g}",
                         "give a value in that range")  # fmt: skip
        _check_large(where, value, self.large, ctx)
        return value

    def describe(self) -> str:
        return f"number in {self._interval()}"


@dataclass(frozen=True)
class Flag:
    """``true`` or ``false``."""

    def __call__(self, value: Any, where: str, ctx: Context) -> bool:
        if not isinstance(value, bool):
            raise refuse(where, f"must be true or false, got {_type_name(value)}", "write true or false")
        return value

    def describe(self) -> str:
        return "true / false"


@dataclass(frozen=True)
class Choice:
    """One of the names ``options()`` returns (a function, so the list is read when checking)."""

    options: Callable[[], Sequence[str]]
    kind: str = "name"

    def __call__(self, value: Any, where: str, ctx: Context) -> str:
        valid = list(self.options())
        if not isinstance(value, str) or value not in valid:
            close = difflib.get_close_matches(str(value), valid, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise refuse(where, f"unknown {self.kind} {_type_name(value)}", f"{hint}valid {self.kind}s are: {', '.join(valid)}")
        return value

    def describe(self) -> str:
        valid = list(self.options())
        return f"one of {', '.join(f'`{v}`' for v in valid)}" if len(valid) <= 8 else f"{self.kind} name"


@dataclass(frozen=True)
class PlainName:
    """A plain name: letters, digits, ``-`` and ``_`` (it becomes part of a folder's name)."""

    def __call__(self, value: Any, where: str, ctx: Context) -> str:
        if not isinstance(value, str) or not _PLAIN_NAME.fullmatch(value):
            raise refuse(where, f"must be a plain name (letters, digits, '-', '_'; at most 100), got {_type_name(value)}",
                         "e.g. mnist1d-depth")  # fmt: skip
        return value

    def describe(self) -> str:
        return "plain name (letters, digits, `-`, `_`)"


@dataclass(frozen=True)
class Text:
    """A non-empty line of text (a path), at most :data:`MAX_TEXT` characters."""

    def __call__(self, value: Any, where: str, ctx: Context) -> str:
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT or any(c in value for c in "\0\n\r"):
            raise refuse(where, f"must be a path on one line (at most {MAX_TEXT} characters), got {_type_name(value)[:80]}",
                         "e.g. docs/results/mnist1d-depth")  # fmt: skip
        return value

    def describe(self) -> str:
        return "path"


@dataclass(frozen=True)
class ListOf:
    """A list of ``item`` values (returned as a tuple), ``min_len`` to ``max_len`` long, optionally distinct."""

    item: Callable[[Any, str, Context], Any]
    min_len: int = 1
    max_len: int = 1000
    distinct: bool = False
    large_len: int | None = None

    def __call__(self, value: Any, where: str, ctx: Context) -> tuple:
        if not isinstance(value, list):
            raise refuse(where, f"must be a list, got {_type_name(value)}", "write it as [a, b, …]")
        if not self.min_len <= len(value) <= self.max_len:
            raise refuse(where, f"must hold {self.min_len} to {self.max_len} values, got {len(value)}",
                         "give a list of that length")  # fmt: skip
        _check_large(where, len(value), self.large_len, ctx, " values")
        out = tuple(self.item(v, f"{where}[{i}]", ctx) for i, v in enumerate(value))
        if self.distinct and len(set(out)) != len(out):
            raise refuse(where, f"holds repeated values {list(value)}", "give each value once")
        return out

    def describe(self) -> str:
        item = getattr(self.item, "describe", lambda: "value")()
        size = f"{self.min_len}" if self.min_len == self.max_len else f"{self.min_len}–{self.max_len}"
        return f"list of {size}" + (" distinct" if self.distinct else "") + f": {item}"


@dataclass(frozen=True)
class Bounds:
    """Two numbers ``[low, high]`` with ``low < high`` (each checked by ``item``)."""

    item: Real

    def __call__(self, value: Any, where: str, ctx: Context) -> tuple[float, float]:
        pair = ListOf(self.item, 2, 2)(value, where, ctx)
        if not pair[0] < pair[1]:
            raise refuse(where, f"must be [low, high] with low < high, got {list(pair)}", "swap or widen them")
        return pair

    def describe(self) -> str:
        return f"[low, high], each a {self.item.describe()}"


@dataclass(frozen=True)
class Section:
    """A nested mapping checked against the :func:`setting` fields of the dataclass ``cls``; it
    becomes a ``cls`` (or a plain dict with ``as_dict``). A profile's section is merged key by key
    into the file's (``merge``) or replaces it whole."""

    cls: type
    as_dict: bool = False
    merge: bool = True

    def __call__(self, value: Any, where: str, ctx: Context) -> Any:
        values = check_section(self.cls, check_mapping(value, where), where, ctx)
        return values if self.as_dict else self.cls(**values)

    def describe(self) -> str:
        return "mapping, keys below"


def setting(default: Any, check: Callable[[Any, str, Context], Any], doc: str, *, factory: Callable | None = None):
    """A dataclass field that carries its ``check`` and ``doc`` (see :func:`check_section`)."""
    metadata = {"check": check, "doc": doc}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section_fields(cls: type) -> dict[str, dataclasses.Field]:
    """The fields of the dataclass ``cls`` that a file may set (those made by :func:`setting`)."""
    return {f.name: f for f in dataclasses.fields(cls) if "check" in f.metadata}


def unknown_key(where: str, key: object, valid: Sequence[str]) -> ConfigurationError:
    close = difflib.get_close_matches(str(key), list(valid), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    place = f"in `{where}`" if where else "at the top level"
    return ConfigurationError(f"unknown key {key!r} {place}; {hint}valid keys are: {', '.join(valid)}")


def check_mapping(value: Any, where: str) -> Mapping:
    if not isinstance(value, dict):
        raise refuse(where, f"must be a mapping of settings, got {_type_name(value)}", "write it as {key: value, …}")
    return value


def check_section(cls: type, raw: Any, where: str, ctx: Context, *, skip: Sequence[str] = ()) -> dict[str, Any]:
    """Check the mapping ``raw`` against the :func:`setting` fields of ``cls``; the checked values by key.

    Unknown keys are refused (naming the closest valid key); keys in ``skip`` are left to the caller.
    """
    fields = section_fields(cls)
    raw = check_mapping(raw, where) if where else raw
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in skip:
            continue
        if key not in fields:
            raise unknown_key(where, key, [*fields, *skip])
        out[key] = fields[key].metadata["check"](value, f"{where}.{key}" if where else key, ctx)
    return out


def schema_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """``(key, type and range, meaning)`` per setting of ``cls`` (the documentation's table)."""
    rows, nested = [], []
    for name, f in section_fields(cls).items():
        check = f.metadata["check"]
        rows.append((f"{prefix}{name}", getattr(check, "describe", lambda: "see below")(), f.metadata["doc"]))
        if isinstance(check, Section):
            nested += schema_rows(check.cls, f"{prefix}{name}.")
    return rows + nested


# --------------------------------------------------------------------------------------------
# the YAML reader
# --------------------------------------------------------------------------------------------


_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(r"^(?:[-+]?(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[-+]?[0-9]+[eE][-+]?[0-9]+"
                    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")  # fmt: skip
_BOOL = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_REPLACED = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's numbers and booleans, bounded nesting, no aliases,
    no duplicate keys."""

    yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag not in _REPLACED]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nesting = 0

    def compose_node(self, parent, index):  # noqa: D102
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ConfigurationError(f"line {mark.line + 1} uses an alias (*name); write the values out instead")
        self._nesting += 1
        try:
            if self._nesting > MAX_NESTING:
                mark = self.peek_event().start_mark
                raise ConfigurationError(f"nesting deeper than {MAX_NESTING} levels at line {mark.line + 1}; "
                                   "an experiment file is a few levels deep")  # fmt: skip
            return super().compose_node(parent, index)
        finally:
            self._nesting -= 1

    def construct_mapping(self, node, deep=False):  # noqa: D102
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise ConfigurationError(f"the key {key!r} appears twice (lines {seen[key]} and "
                                       f"{key_node.start_mark.line + 1}); keep one")  # fmt: skip
                seen[key] = key_node.start_mark.line + 1
            except TypeError:
                raise ConfigurationError(f"line {key_node.start_mark.line + 1}: a key must be a name or a number") from None
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):  # noqa: D102
        return int(self.construct_scalar(node))

    def construct_yaml_float(self, node):  # noqa: D102
        text = self.construct_scalar(node).lower()
        if text.endswith(".inf"):
            return -math.inf if text.startswith("-") else math.inf
        return math.nan if text == ".nan" else float(text)


StrictLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL, list("tTfF"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)


def read_yaml_file(path: str | Path, what: str = "experiment file") -> Any:
    """The data of the YAML file ``path``, read with :class:`StrictLoader` after the size and
    encoding checks; any problem is one :class:`ConfigurationError` naming the file and the fix."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigurationError(f"the {what} {path} is not a regular file; give the path of a YAML file")
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigurationError(f"the {what} {path} is {info.st_size} bytes, over the limit of {MAX_FILE_BYTES}; "
                                     "an experiment file is a few kB: is this the right file?")  # fmt: skip
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise ConfigurationError(f"cannot read the {what} {path} ({err.strerror or err}); check the path") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigurationError(f"the {what} {path} is over the limit of {MAX_FILE_BYTES} bytes; is this the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigurationError(f"the {what} {path} is not UTF-8 text (byte {err.start} is not; a binary file?); "
                                 "give a YAML text file") from None  # fmt: skip
    if "\0" in text:
        raise ConfigurationError(f"the {what} {path} holds NUL bytes (a binary file?); give a YAML text file")
    loader = StrictLoader(text)
    try:
        return loader.get_single_data()
    except ConfigurationError as err:  # raised by StrictLoader: a problem of the file itself
        raise ConfigurationError(f"the {what} {path}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise ConfigurationError(f"the {what} {path} is not valid YAML{where} ({problem}); fix the syntax") from None
    except RecursionError:  # the nesting bound stops this first; kept as the last line of defence
        raise ConfigurationError(f"the {what} {path} is nested too deeply; an experiment file is a few levels deep") from None
    finally:
        loader.dispose()
