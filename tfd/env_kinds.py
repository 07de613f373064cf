"""The kinds of value a row of the environment table may hold, each with its parser.

A kind turns the text of an environment variable or a flag into a typed value, or raises
``Malformed`` whose message is the expected form ("must be exactly 0 or 1"). Parsers are strict:
no surrounding spaces, no ``1_000``, no ``yes`` for a switch, so a value means one thing only.
"""

from __future__ import annotations

import ipaddress
import math
import re
from typing import Protocol

import attrs

_INTEGER = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_NAME = re.compile(r"[!-~]{1,256}")
_SECRET_ITEM = re.compile(r"[!-+\--~]+")  # printable ASCII without space and comma
# sun_path is 108 bytes on Linux, one of them the terminating NUL.
UNIX_PATH_MAX = 107


class Malformed(ValueError):
    """A value that does not have the row's form; the message is that form."""


class Kind(Protocol):
    """What every kind offers the table."""

    @property
    def form(self) -> str:
        """The expected form, short, for tables ("0 or 1", "integer 0..65535")."""
        ...

    @property
    def expected(self) -> str:
        """The refusal text, a sentence fragment ("must be exactly 0 or 1")."""
        ...

    @property
    def metavar(self) -> str:
        """The placeholder of its flag's value in ``--help``."""
        ...

    def parse(self, text: str) -> object:
        """The typed value of ``text``; raises ``Malformed`` with ``expected``."""
        ...


def _number(value: float) -> str:
    """A bound as a person writes it: 30, not 30.0."""
    return str(int(value)) if float(value).is_integer() else repr(value)


@attrs.frozen
class Switch:
    """Exactly ``0`` or ``1``: nothing else, so a typo never reads as off."""

    form = "0 or 1"
    expected = "must be exactly 0 or 1"
    metavar = "0|1"

    def parse(self, text: str) -> bool:
        if text not in ("0", "1"):
            raise Malformed(self.expected)
        return text == "1"


@attrs.frozen
class Integer:
    """A decimal integer within ``[low, high]``, a multiple of ``step``; with ``zero_off``, 0 too."""

    low: int
    high: int
    step: int = 1
    zero_off: bool = False
    auto: bool = False  # the word "auto" is allowed too, read as None
    metavar = "N"

    @property
    def form(self) -> str:
        steps = f" step {self.step}" if self.step > 1 else ""
        word = "auto | " if self.auto else "0 (off) | " if self.zero_off else ""
        return word + f"integer {self.low}..{self.high}{steps}"

    @property
    def expected(self) -> str:
        what = f"a multiple of {self.step}" if self.step > 1 else "an integer"
        word = "auto or " if self.auto else "0 (off) or " if self.zero_off else ""
        return f"must be {word}{what} from {self.low} to {self.high}"

    def parse(self, text: str) -> int | None:
        if self.auto and text == "auto":
            return None
        if not _INTEGER.fullmatch(text):
            raise Malformed(self.expected)
        value = int(text)
        if value == 0 and self.zero_off:
            return value
        if not self.low <= value <= self.high or value % self.step:
            raise Malformed(self.expected)
        return value


@attrs.frozen
class Real:
    """A finite decimal number within ``[low, high]``; ``unit`` names what it counts."""

    low: float
    high: float
    unit: str = ""
    auto: bool = False  # the word "auto" is allowed too, read as None
    metavar = "NUMBER"

    @property
    def form(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return ("auto | " if self.auto else "") + f"number {_number(self.low)}..{_number(self.high)}{unit}"

    @property
    def expected(self) -> str:
        what = f"a number of {self.unit}" if self.unit else "a number"
        word = "auto or " if self.auto else ""
        return f"must be {word}{what} from {_number(self.low)} to {_number(self.high)}"

    def parse(self, text: str) -> float | None:
        if self.auto and text == "auto":
            return None
        if not _REAL.fullmatch(text):
            raise Malformed(self.expected)
        value = float(text)
        if not math.isfinite(value) or not self.low <= value <= self.high:
            raise Malformed(self.expected)
        return value


@attrs.frozen
class Choice:
    """One of a fixed list of words, matched exactly."""

    values: tuple[str, ...]

    @property
    def metavar(self) -> str:
        return "{" + ",".join(self.values) + "}"

    @property
    def form(self) -> str:
        return " | ".join(self.values)

    @property
    def expected(self) -> str:
        return "must be one of " + ", ".join(self.values)

    def parse(self, text: str) -> str:
        if text not in self.values:
            raise Malformed(self.expected)
        return text


@attrs.frozen
class FilePath:
    """An absolute path; a socket path also fits in a Unix socket address."""

    socket: bool = False
    metavar = "PATH"

    @property
    def form(self) -> str:
        return "absolute path of a Unix socket" if self.socket else "absolute path"

    @property
    def expected(self) -> str:
        if self.socket:
            return f"must be an absolute path of at most {UNIX_PATH_MAX} bytes (a Unix socket address)"
        return "must be an absolute path"

    def parse(self, text: str) -> str:
        if not text.startswith("/") or "\0" in text:
            raise Malformed(self.expected)
        try:
            size = len(text.encode("utf-8", "surrogateescape"))
        except UnicodeEncodeError as error:
            raise Malformed(self.expected) from error
        if self.socket and size > UNIX_PATH_MAX:
            raise Malformed(self.expected)
        return text


@attrs.frozen
class Host:
    """An IPv4 or IPv6 address, or a DNS host name."""

    form = "IP address or host name"
    expected = "must be an IP address or a host name"
    metavar = "HOST"

    def parse(self, text: str) -> str:
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            pass
        labels = text.removesuffix(".").split(".")
        if len(text) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
            raise Malformed(self.expected)
        return text


@attrs.frozen
class Name:
    """A name shown to clients: printable ASCII, no spaces, at most 256 characters."""

    form = "name"
    expected = "must be 1 to 256 printable ASCII characters without spaces"
    metavar = "NAME"

    def parse(self, text: str) -> str:
        if not _NAME.fullmatch(text):
            raise Malformed(self.expected)
        return text


@attrs.frozen
class Secret:
    """Comma-separated keys of printable ASCII without spaces; shown masked everywhere."""

    form = "KEY[,KEY...]"
    metavar = "KEYS"
    expected = "must be comma-separated keys of printable ASCII, with no spaces and no empty key"

    def parse(self, text: str) -> tuple[str, ...]:
        keys = tuple(text.split(","))
        if not all(_SECRET_ITEM.fullmatch(key) for key in keys):
            raise Malformed(self.expected)
        return keys


def kind_from_row(name: str, spec: dict[str, object]) -> Kind:
    """Build the kind a TOML row declares; a bad declaration is a bug in tfd's table."""
    kind = spec.get("kind")
    if kind == "switch":
        return Switch()
    if kind == "int":
        step = spec.get("step", 1)
        if not isinstance(step, int) or step < 1:
            raise TypeError(f"{name}: `step` must be a positive integer")
        return Integer(_whole(name, spec, "min"), _whole(name, spec, "max"), step,
                       bool(spec.get("zero_off", False)), bool(spec.get("auto", False)))
    if kind in ("float", "gib"):
        unit = "GiB" if kind == "gib" else str(spec.get("unit", ""))
        return Real(_bound(name, spec, "min"), _bound(name, spec, "max"), unit, bool(spec.get("auto", False)))
    if kind == "enum":
        values = spec.get("values")
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise TypeError(f"{name}: an enum row needs `values`, a non-empty list of strings")
        return Choice(tuple(values))
    if kind == "path":
        return FilePath(socket=bool(spec.get("socket", False)))
    if kind == "host":
        return Host()
    if kind == "secret":
        return Secret()
    if kind == "name":
        return Name()
    raise TypeError(f"{name}: unknown kind {kind!r}")


def _bound(name: str, spec: dict[str, object], key: str) -> float:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name}: a {spec.get('kind')} row needs a numeric `{key}`")
    return float(value)


def _whole(name: str, spec: dict[str, object], key: str) -> int:
    value = _bound(name, spec, key)
    if not value.is_integer():
        raise TypeError(f"{name}: an int row needs a whole `{key}`")
    return int(value)
