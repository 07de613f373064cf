"""The rows of the environment table as ``env/<scope>.toml`` writes them: ``Row`` and its parsing.

A row is one TOML table: its kind (``tfd.env_kinds``) and bounds, default, help, flag, and its
relations to other rows (``requires``, ``excludes``, ``inherits``, ``needs``: ``tfd.env_needs``). A
malformed row is a bug in tfd and raises ``TypeError`` as the table loads (``tfd.env``).
"""

from __future__ import annotations

from pathlib import Path

import attrs

from tfd.env_kinds import Kind, Secret, kind_from_row
from tfd.env_needs import Need, needs_from_toml

PREFIX = "TF_"
_ROW_KEYS = frozenset({"kind", "default", "default_doc", "help", "requires", "needs", "excludes", "inherits",
                       "flag", "min", "max", "step", "zero_off", "auto", "values", "socket", "unit"})


@attrs.frozen
class Row:
    """One setting: its name, scope, kind, default (as text), help and relations."""

    name: str
    scope: str
    kind: Kind
    help: str
    default: str | None = None
    default_doc: str | None = None
    requires: str | None = None
    excludes: str | None = None  # a row that must not be set beside this one
    needs: tuple[Need, ...] = ()  # bounds on other rows while this one is on
    inherits: str | None = None
    flag: str | None = None

    @property
    def secret(self) -> bool:
        return isinstance(self.kind, Secret)

    @property
    def default_text(self) -> str:
        """The default for people: the value, or how it is computed, or 'unset'."""
        if self.default is not None:
            return self.default
        if self.inherits is not None:
            return f"as {self.inherits}"
        return self.default_doc or "unset"



def row_from_toml(name: str, scope: str, spec: dict[str, object]) -> Row:
    if not name.startswith(PREFIX) or not name.isupper():
        raise TypeError(f"env/{scope}.toml: row name {name!r} must be upper case and start {PREFIX}")
    unknown = set(spec) - _ROW_KEYS
    if unknown:
        raise TypeError(f"{name}: unknown keys {sorted(unknown)}")
    help_text = spec.get("help")
    if not isinstance(help_text, str) or not help_text:
        raise TypeError(f"{name}: a row needs `help`")
    kind = kind_from_row(name, spec)
    flag = spec.get("flag", None if isinstance(kind, Secret) else _flag_of(name))
    if flag is not None and flag is not False and not (isinstance(flag, str) and flag.startswith("--")):
        raise TypeError(f"{name}: `flag` must be a --name or false")
    return Row(
        name=name,
        scope=scope,
        kind=kind,
        help=help_text,
        default=_optional_str(name, spec, "default"),
        default_doc=_optional_str(name, spec, "default_doc"),
        requires=_optional_str(name, spec, "requires"),
        excludes=_optional_str(name, spec, "excludes"),
        needs=needs_from_toml(name, spec.get("needs")),
        inherits=_optional_str(name, spec, "inherits"),
        flag=flag or None,
    )


def _flag_of(name: str) -> str:
    return "--" + name.removeprefix(PREFIX).lower().replace("_", "-")


def _optional_str(name: str, spec: dict[str, object], key: str) -> str | None:
    value = spec.get(key)
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name}: `{key}` must be a string")
    return value


def table_directory() -> Path:
    """``env/`` of a source checkout (editable installs too), else the copy inside the wheel."""
    package = Path(__file__).resolve().parent
    checkout = package.parent / "env"
    return checkout if (checkout / "core.toml").exists() else package / "_env"
