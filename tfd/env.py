"""The environment table: every setting of tfd, read once at startup and refused by name.

Rows live in ``env/<scope>.toml`` (one TOML table per row). Startup reads the whole environment
once, before torch or any device work, through ``Table.read``: every malformed value, every unknown
``TF_*`` name, every unmet ``requires`` or ``needs`` (``tfd.env_needs``) and every pair a row
``excludes`` is collected and raised together as ``SettingsRefused``, each problem naming the
variable and the form it expects. That pass checks the form of every row of every scope, the family
scopes (``flashnext``, ``qwen3_5``, ``qwen3_next``) included; what waits for the family that loads
(``Settings.check_family``) is only whether its rows apply: their values and their ``requires``, so
a Flash Next row that needs another does not stop a Qwen3.5 start, while a malformed one does.

Flags of ``tfd serve`` are generated from the rows; a flag beats the environment and meets the same
parser. An empty value counts as unset, as systemd's ``EnvironmentFile=`` writes ``NAME=``.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Literal, TypeVar

import attrs

from tfd.env_kinds import Malformed, Switch
from tfd.env_rows import PREFIX, Row, row_from_toml, table_directory

SCOPES = ("core", "server", "pool", "learn", "cuda", "flashnext", "qwen3_5", "qwen3_next")
FAMILY_SCOPES = frozenset({"flashnext", "qwen3_5", "qwen3_next"})
# config.json model_type -> the scope of its family's rows.
MODEL_TYPE_SCOPES = {
    "qwen3_5": "qwen3_5",
    "qwen3_5_moe": "qwen3_5",
    "qwen3_next": "qwen3_next",
    "qwen4_exp": "flashnext",
}
_SHOWN_MAX = 64
MASK = "********"

Source = Literal["flag", "environment", "default", "inherited", "unset"]
T = TypeVar("T")


class SettingsRefused(Exception):
    """The configuration is refused; ``problems`` holds one line per bad value, each by name.

    The command line answers it with exit status ``EXIT_STATUS`` and nothing else started.
    """

    EXIT_STATUS = 2

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__(self.problems)

    def __str__(self) -> str:
        count = len(self.problems)
        head = "configuration refused" + (f" ({count} problems)" if count > 1 else "")
        return head + ":\n" + "\n".join(f"  {problem}" for problem in self.problems)


def shown(text: str) -> str:
    """A value as it may be printed: itself when short and printable, else its repr, cut."""
    if len(text) <= _SHOWN_MAX and text.isprintable():
        return text
    text = repr(text)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 3] + "..."


@attrs.frozen
class Table:
    """All rows, and the TF_* names of other programs that tfd leaves alone."""

    rows: tuple[Row, ...]
    foreign_names: frozenset[str] = frozenset()
    foreign_prefixes: tuple[str, ...] = ()

    @classmethod
    def load(cls, directory: Path | None = None) -> Table:
        """Read ``env/*.toml``; a malformed table is a bug in tfd and raises ``TypeError``."""
        directory = directory or table_directory()
        rows: list[Row] = []
        for scope in SCOPES:
            path = directory / f"{scope}.toml"
            if path.exists():
                for name, spec in tomllib.loads(path.read_text()).items():
                    rows.append(row_from_toml(name, scope, spec))
        known = set(SCOPES) | {"foreign"}
        stray = sorted(p.stem for p in directory.glob("*.toml") if p.stem not in known)
        if stray:
            raise TypeError(f"{directory}: files for unknown scopes {stray}; scopes are {SCOPES}")
        foreign = tomllib.loads((directory / "foreign.toml").read_text())
        table = cls(
            tuple(rows),
            frozenset(n for group in foreign.values() for n in group["names"]),
            tuple(p for group in foreign.values() for p in group["prefixes"]),
        )
        table._check()
        return table

    def _check(self) -> None:
        names = [row.name for row in self.rows]
        if len(set(names)) != len(names):
            raise TypeError("environment table: a name appears twice")
        by_name = self.by_name()
        for row in self.rows:
            if row.default is not None:
                row.kind.parse(row.default)
            if row.excludes is not None and (by_name.get(row.excludes) is None or row.excludes == row.name):
                raise TypeError(f"{row.name}: excludes unknown {row.excludes}")
            for need in row.needs:
                if by_name.get(need.row) is None or by_name[need.row].scope in FAMILY_SCOPES:
                    raise TypeError(f"{row.name}: needs unknown or family row {need.row}")
            if row.requires is not None:
                target = by_name.get(row.requires)
                if target is None:
                    raise TypeError(f"{row.name}: requires unknown {row.requires}")
                if target.scope in FAMILY_SCOPES and target.scope != row.scope:
                    raise TypeError(f"{row.name}: requires a row of another family, {row.requires}")
            if self.is_foreign(row.name):
                raise TypeError(f"{row.name}: also listed as another program's name")
            if row.inherits is not None:
                source = by_name.get(row.inherits)
                if source is None or source.scope in FAMILY_SCOPES or source.kind != row.kind \
                        or row.default is not None:
                    raise TypeError(f"{row.name}: inherits {row.inherits}, which must be a row of the "
                                    "same kind outside the family scopes, and then has no default")

    @functools.cached_property
    def _index(self) -> dict[str, Row]:
        return {row.name: row for row in self.rows}

    def by_name(self) -> Mapping[str, Row]:
        return MappingProxyType(self._index)

    def in_scope(self, scope: str) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if row.scope == scope)

    def is_foreign(self, name: str) -> bool:
        return name in self.foreign_names or name.startswith(self.foreign_prefixes)

    def read(
        self,
        environ: Mapping[str, str],
        flags: Mapping[str, str] | None = None,
        *,
        families: Iterable[str] = (),
        only: Iterable[str] | None = None,
    ) -> Settings:
        """Read the environment and flags; raise ``SettingsRefused`` naming every problem.

        ``flags`` maps row names to the text given on the command line (empty: unset). Every row's
        form is checked here; the values of family scopes are kept as text until
        ``Settings.check_family`` (their ``requires`` too), except those of ``families``, checked
        whole in the same pass. ``only`` restricts reading to these row names
        and skips the unknown-name check (for ``tfd admin``, which needs one row).
        """
        flags = flags or {}
        rows = self.rows if only is None else tuple(self.by_name()[name] for name in only)
        problems: list[str] = []
        if only is None:
            problems += self._unknown_names(environ)
        texts: dict[str, tuple[str | None, Source]] = {}
        for row in rows:
            if row.name in flags:  # an empty flag unsets what the environment says
                texts[row.name] = (flags[row.name] or None, "flag")
            elif environ.get(row.name):
                texts[row.name] = (environ[row.name], "environment")
            elif row.default is not None:
                texts[row.name] = (row.default, "default")
            elif row.inherits is not None:
                texts[row.name] = (None, "inherited")
            else:
                texts[row.name] = (None, "unset")
        settings = Settings(self, texts, {}, frozenset())
        scopes = {row.scope for row in rows} - (FAMILY_SCOPES - {family_scope(f) for f in families})
        # Another family's rows are malformed or not whatever loads: their form is refused now.
        return settings._checked(scopes, problems, {row.scope for row in rows} - scopes)

    def _unknown_names(self, environ: Mapping[str, str]) -> list[str]:
        known = self.by_name()
        problems = []
        for name in sorted(environ):
            if name.startswith(PREFIX) and name not in known and not self.is_foreign(name):
                close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
                hint = f"; did you mean {close[0]}?" if close else "; `tfd env` lists every setting"
                problems.append(f"{name}: unknown setting{hint}")
        return problems

    def add_flags(self, parser: argparse.ArgumentParser, scopes: Iterable[str] = SCOPES,
                  only: Iterable[str] | None = None) -> None:
        """One flag per row with a flag, grouped by scope; values stay text for ``read``. ``only``
        keeps the rows of these names (a command that reads no other)."""
        kept = None if only is None else set(only)
        for scope in scopes:
            rows = [row for row in self.in_scope(scope) if row.flag and (kept is None or row.name in kept)]
            if not rows:
                continue
            group = parser.add_argument_group(f"{scope} settings (flag beats environment)")
            for row in rows:
                assert row.flag is not None
                about = f"{row.help} [{row.name}; default {row.default_text}]".replace("%", "%%")
                if isinstance(row.kind, Switch):
                    negative = "--no-" + row.flag.removeprefix("--")
                    group.add_argument(row.flag, dest=row.name, action="store_const", const="1",
                                       help=about)
                    group.add_argument(negative, dest=row.name, action="store_const", const="0",
                                       help=f"set {row.name}=0")
                else:
                    group.add_argument(row.flag, dest=row.name, metavar=row.kind.metavar,
                                       help=about)

    def flag_values(self, namespace: argparse.Namespace) -> dict[str, str]:
        """The rows given as flags, by row name."""
        values = vars(namespace)
        return {row.name: values[row.name] for row in self.rows
                if row.flag and values.get(row.name) is not None}


@attrs.frozen
class Settings:
    """The effective values, typed, with where each came from; immutable."""

    table: Table
    texts: Mapping[str, tuple[str | None, Source]]
    values: Mapping[str, object]
    checked_scopes: frozenset[str]

    def __getitem__(self, name: str) -> object:
        if name not in self.values:
            row = self.table.by_name()[name]
            raise LookupError(f"{name} belongs to scope {row.scope}, not checked in these settings")
        return self.values[name]

    def value(self, name: str, cls: type[T]) -> T:
        """The value of ``name``, which must be set and of type ``cls``."""
        value = self.optional(name, cls)
        if value is None:
            raise LookupError(f"{name} is unset and has no default")
        return value

    def optional(self, name: str, cls: type[T]) -> T | None:
        """The value of ``name`` or None when unset; a value of another type is a bug in tfd."""
        value = self[name]
        if value is not None and not isinstance(value, cls):
            raise TypeError(f"{name} holds {type(value).__name__}, not {cls.__name__}")
        return value

    def source(self, name: str) -> Source:
        return self.texts[name][1]

    def check_family(self, family: str) -> Settings:
        """Check the rows of ``family`` (a scope or a ``model_type``) as that family loads.

        This is the loader's hook: call it after reading ``config.json`` and before any device
        work. Raises ``SettingsRefused`` naming each bad row of that scope.
        """
        return self._checked({family_scope(family)}, [])

    def effective(self) -> list[dict[str, object]]:
        """The checked rows as records for people and the admin socket; secrets masked."""
        records: list[dict[str, object]] = []
        for row in self.table.rows:
            if row.scope not in self.checked_scopes:
                continue
            text, source = self.texts[row.name]
            if source == "inherited" and row.inherits is not None:
                text = self.texts[row.inherits][0]
            if row.secret and text is not None:
                text = MASK
            records.append({"name": row.name, "scope": row.scope, "value": text, "source": source})
        return records

    def _checked(self, scopes: set[str], problems: list[str], form_only: set[str] = frozenset()) -> Settings:
        """Parse the rows of ``scopes`` into values and check their ``requires``; the rows of
        ``form_only`` scopes are parsed for their problems alone (their values wait for their family).
        Problems come in the table's order."""
        rows = [row for row in self.table.rows if row.scope in scopes and row.name in self.texts]
        values = dict(self.values)
        for row in self.table.rows:
            if row.name not in self.texts or row.scope not in scopes | form_only:
                continue
            text, source = self.texts[row.name]
            if source == "inherited" and row.inherits is not None:
                if row.scope in scopes and row.inherits in values:  # else the source was refused
                    values[row.name] = values[row.inherits]
                continue
            if text is None:
                if row.scope in scopes:
                    values[row.name] = None
                continue
            try:
                value = row.kind.parse(text)
            except Malformed as error:
                problems.append(f"{_given(row, text, source)}: {error}")
                continue
            if row.scope in scopes:
                values[row.name] = value
        for row in rows:
            text, source = self.texts[row.name]
            # A default or inherited value needs nothing: only what the user gave is refused.
            if row.requires and source in ("environment", "flag") and _engaged(values.get(row.name)):
                target = self.table.by_name()[row.requires]
                # "auto" reads as None, yet it is on
                engaged = _engaged(values.get(target.name)) or self.texts[target.name][0] == "auto"
                if target.name in values and not engaged:
                    state = "0 (off)" if values[target.name] == 0 else "unset"
                    problems.append(f"{_given(row, text or '', source)} requires {target.name},"
                                    f" which is {state}")
            if _engaged(values.get(row.name)):
                for need in row.needs:
                    if need.row in values:
                        other_text, other_source = self.texts[need.row]
                        shown_as = other_text if other_text is not None else str(values[need.row])
                        given = _given(self.table.by_name()[need.row], shown_as, other_source)
                        found = need.problem(_given(row, text or "", source), values[need.row], given)
                        problems += [found] if found is not None else []
            other = row.excludes
            if other and source in ("environment", "flag") and values.get(row.name) is not None \
                    and self.texts.get(other, (None, "unset"))[1] in ("environment", "flag") \
                    and self.texts[other][0] is not None:
                problems.append(f"{_given(row, text or '', source)} excludes {other}, which is set too "
                                f"({_given(self.table.by_name()[other], *self.texts[other])}): set one")
        if problems:
            raise SettingsRefused(problems)
        return attrs.evolve(self, values=values, checked_scopes=self.checked_scopes | scopes)


def family_scope(family: str) -> str:
    """The scope of a family given as a scope or as a config.json ``model_type``."""
    scope = MODEL_TYPE_SCOPES.get(family, family)
    if scope not in FAMILY_SCOPES:
        raise ValueError(f"{family!r} is neither a family scope nor a known model_type")
    return scope


def _engaged(value: object) -> bool:
    """Whether a row is on: set, and neither a switch at 0 nor a number at 0."""
    return value is not None and value is not False and value != 0


def _given(row: Row, text: str, source: Source) -> str:
    """How the user gave a value: ``TF_PORT=http`` or ``--port http (TF_PORT)``."""
    if source == "flag":
        return f"{row.flag} {shown(text)} ({row.name})"
    return f"{row.name}={shown(text)}"
