"""The environment table: parsing, refusals by name, family scopes, flags, rendered files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfd.cli import build_parser
from tfd.env import FAMILY_SCOPES, MASK, SCOPES, SettingsRefused, Table
from tfd.env_docs import render_envfile, render_markdown

TABLE = Table.load()
ROOT = Path(__file__).resolve().parent.parent

# Adding or removing a row is a deliberate change: update this count in the same commit.
ROWS_PER_SCOPE = {
    "core": 8,
    "server": 17,
    "pool": 5,
    "learn": 8,
    "cuda": 2,
    "flashnext": 2,
    "qwen3_5": 0,
    "qwen3_next": 0,
}


def refusal(environ: dict[str, str], **kwargs: object) -> tuple[str, ...]:
    with pytest.raises(SettingsRefused) as refused:
        TABLE.read(environ, **kwargs)  # type: ignore[arg-type]
    return refused.value.problems


def test_rows_per_scope_are_pinned() -> None:
    assert {scope: len(TABLE.in_scope(scope)) for scope in SCOPES} == ROWS_PER_SCOPE


def test_defaults_without_environment() -> None:
    settings = TABLE.read({})
    assert settings["TF_PORT"] == 8000
    assert settings["TF_HOST"] == "127.0.0.1"
    assert settings["TF_DRAIN_TIMEOUT_S"] == 30.0
    assert settings["TF_LOG_LEVEL"] == "info"
    assert settings["TF_API_KEYS"] is None
    assert settings.source("TF_PORT") == "default"
    assert settings.source("TF_HTTP_SOCKET") == "unset"
    assert settings.value("TF_PORT", int) == 8000
    assert settings.optional("TF_HTTP_SOCKET", str) is None
    with pytest.raises(LookupError, match="TF_HTTP_SOCKET is unset"):
        settings.value("TF_HTTP_SOCKET", str)
    with pytest.raises(TypeError, match="TF_PORT holds int, not str"):
        settings.value("TF_PORT", str)


@pytest.mark.parametrize("text", ["2", "true", "yes", "on", " 1", "1 ", "01", "-0", "1.0"])
def test_switch_is_exactly_0_or_1(text: str) -> None:
    environ = {"TF_FLASHNEXT_KV_PAGES": "256", "TF_FLASHNEXT_STATE_PAGES": text}
    assert refusal(environ, families=["flashnext"]) == (
        f"TF_FLASHNEXT_STATE_PAGES={text}: must be exactly 0 or 1",)


@pytest.mark.parametrize(("name", "text", "value"), [
    ("TF_PORT", "0", 0), ("TF_PORT", "65535", 65535), ("TF_PORT", "+80", 80),
    ("TF_DRAIN_TIMEOUT_S", "0", 0.0), ("TF_DRAIN_TIMEOUT_S", "1e1", 10.0),
    ("TF_DRAIN_TIMEOUT_S", ".5", 0.5), ("TF_HOST", "::1", "::1"), ("TF_HOST", "localhost", "localhost"),
    ("TF_HOST", "gpu-7.example.org", "gpu-7.example.org"), ("TF_LOG_LEVEL", "debug", "debug"),
    ("TF_API_KEYS", "k1,k-2", ("k1", "k-2")), ("TF_HTTP_SOCKET", "/run/tfd/http.sock", "/run/tfd/http.sock"),
    ("TF_KV_PAGES", "0", 0), ("TF_KV_PAGES", "16", 16), ("TF_KV_PAGES", "8192", 8192),
    ("TF_CUDA_MEMORY_LIMIT_GB", "79.5", 79.5),
    ("TF_PROMPT_CACHE_GIB", "auto", None), ("TF_PROMPT_CACHE_GIB", "0", 0.0),
    ("TF_PROMPT_CACHE_GIB", "2.5", 2.5), ("TF_POOL_GIB", "0.001", 0.001),
])
def test_values_accepted(name: str, text: str, value: object) -> None:
    settings = TABLE.read({name: text})
    assert settings[name] == value
    assert settings.source(name) == "environment"


@pytest.mark.parametrize(("name", "text", "expected"), [
    ("TF_PORT", "http", "must be an integer from 0 to 65535"),
    ("TF_PORT", "65536", "must be an integer from 0 to 65535"),
    ("TF_PORT", "8_000", "must be an integer from 0 to 65535"),
    ("TF_PORT", " 8000", "must be an integer from 0 to 65535"),
    ("TF_PORT", "8e3", "must be an integer from 0 to 65535"),
    ("TF_DRAIN_TIMEOUT_S", "nan", "must be a number from 0 to 3600"),
    ("TF_DRAIN_TIMEOUT_S", "inf", "must be a number from 0 to 3600"),
    ("TF_DRAIN_TIMEOUT_S", "-1", "must be a number from 0 to 3600"),
    ("TF_LOG_LEVEL", "INFO", "must be one of debug, info, warning, error"),
    ("TF_HOST", "not a host", "must be an IP address or a host name"),
    ("TF_HOST", "-bad.example", "must be an IP address or a host name"),
    ("TF_HTTP_SOCKET", "relative.sock", "must be an absolute path of at most 107 bytes"),
    ("TF_ADMIN_SOCKET", "/" + "a" * 107, "must be an absolute path of at most 107 bytes"),
    ("TF_API_KEYS", "k1,,k2", "must be comma-separated keys"),
    ("TF_API_KEYS", "has space", "must be comma-separated keys"),
    ("TF_KV_PAGES", "8", "must be 0 (off) or a multiple of 16 from 16 to 8192"),
    ("TF_KV_PAGES", "264", "must be 0 (off) or a multiple of 16 from 16 to 8192"),
    ("TF_CUDA_MEMORY_LIMIT_GB", "0", "must be a number of GiB from 0.25 to 16384"),
    ("TF_CUDA_MEMORY_LIMIT_GB", "auto", "must be a number of GiB from 0.25 to 16384"),
    ("TF_PROMPT_CACHE_GIB", "Auto", "must be auto or a number of GiB from 0 to 16384"),
    ("TF_PROMPT_CACHE_GIB", "-1", "must be auto or a number of GiB from 0 to 16384"),
    ("TF_POOL_GIB", "auto", "must be a number of GiB from 0.001 to 16384"),
])
def test_malformed_values_are_refused_by_name(name: str, text: str, expected: str) -> None:
    (problem,) = refusal({name: text})
    assert problem.startswith(f"{name}=")
    assert expected in problem


def test_auto_counts_as_on_for_a_row_that_requires_it() -> None:
    settings = TABLE.read({"TF_PROMPT_KEEP_GAIN": "64"})  # the cache is auto by default
    assert (settings["TF_PROMPT_CACHE_GIB"], settings["TF_PROMPT_KEEP_GAIN"]) == (None, 64)
    auto = TABLE.read({"TF_PROMPT_KEEP_GAIN": "64", "TF_PROMPT_CACHE_GIB": "auto"})
    assert auto["TF_PROMPT_KEEP_GAIN"] == 64
    assert refusal({"TF_PROMPT_KEEP_GAIN": "64", "TF_PROMPT_CACHE_GIB": "0"}) == (
        "TF_PROMPT_KEEP_GAIN=64 requires TF_PROMPT_CACHE_GIB, which is 0 (off)",)
    assert TABLE.read({})["TF_POOL_GIB"] is None  # unset: the CPU's default or the GPU's plan


def test_empty_value_counts_as_unset() -> None:
    settings = TABLE.read({"TF_PORT": "", "TF_HTTP_SOCKET": ""})
    assert settings["TF_PORT"] == 8000
    assert settings["TF_HTTP_SOCKET"] is None


def test_unknown_name_is_refused_with_the_closest_known_name() -> None:
    assert refusal({"TF_PROT": "8000"}) == ("TF_PROT: unknown setting; did you mean TF_PORT?",)
    (problem,) = refusal({"TF_SOMETHING_ELSE": "1"})
    assert problem == "TF_SOMETHING_ELSE: unknown setting; `tfd env` lists every setting"


def test_other_programs_names_are_left_alone() -> None:
    environ = {"TF_CLI_CONFIG_FILE": "/root/.terraformrc", "TF_VAR_region": "eu",
               "TF_CPP_MIN_LOG_LEVEL": "3", "TF_LOG": "DEBUG"}
    assert TABLE.read(environ)["TF_PORT"] == 8000


def test_every_problem_is_named_in_one_refusal() -> None:
    environ = {"TF_PORT": "http", "TF_DRAIN_TIMEOUT_S": "soon", "TF_PROT": "1",
               "TF_FLASHNEXT_STATE_PAGES": "2"}
    problems = refusal(environ, families=FAMILY_SCOPES)
    assert problems == (
        "TF_PROT: unknown setting; did you mean TF_PORT?",
        "TF_PORT=http: must be an integer from 0 to 65535",
        "TF_DRAIN_TIMEOUT_S=soon: must be a number from 0 to 3600",
        "TF_FLASHNEXT_STATE_PAGES=2: must be exactly 0 or 1",
    )
    text = str(SettingsRefused(problems))
    assert text.startswith("configuration refused (4 problems):\n")


def test_requires_names_both_rows() -> None:
    (problem,) = refusal({"TF_FLASHNEXT_STATE_PAGES": "1", "TF_FLASHNEXT_KV_PAGES": "0"},
                         families=["flashnext"])
    assert problem == "TF_FLASHNEXT_STATE_PAGES=1 requires TF_FLASHNEXT_KV_PAGES, which is 0 (off)"
    (problem,) = refusal({"TF_STATE_PAGES": "1", "TF_KV_PAGES": "0"})
    assert problem == "TF_STATE_PAGES=1 requires TF_KV_PAGES, which is 0 (off)"
    # Pages off inherited from the core row: the explicit Flash Next switch is refused too.
    (problem,) = refusal({"TF_FLASHNEXT_STATE_PAGES": "1", "TF_KV_PAGES": "0"}, families=["flashnext"])
    assert problem == "TF_FLASHNEXT_STATE_PAGES=1 requires TF_FLASHNEXT_KV_PAGES, which is 0 (off)"
    settings = TABLE.read({"TF_FLASHNEXT_STATE_PAGES": "1", "TF_FLASHNEXT_KV_PAGES": "128"},
                          families=["flashnext"])
    assert settings["TF_FLASHNEXT_STATE_PAGES"] is True
    assert settings["TF_FLASHNEXT_KV_PAGES"] == 128
    # Off needs nothing, and a default that requires is not the user's doing.
    assert TABLE.read({"TF_FLASHNEXT_STATE_PAGES": "0", "TF_KV_PAGES": "0"}, families=["flashnext"])[
        "TF_FLASHNEXT_STATE_PAGES"] is False
    assert TABLE.read({"TF_KV_PAGES": "0"})["TF_STATE_PAGES"] is True


def test_a_family_row_inherits_its_core_row_until_set() -> None:
    settings = TABLE.read({"TF_KV_PAGES": "512", "TF_STATE_PAGES": "0"}, families=["flashnext"])
    assert settings["TF_FLASHNEXT_KV_PAGES"] == 512
    assert settings["TF_FLASHNEXT_STATE_PAGES"] is False
    assert settings.source("TF_FLASHNEXT_KV_PAGES") == "inherited"
    rows = {row["name"]: row for row in settings.effective()}
    assert rows["TF_FLASHNEXT_KV_PAGES"] == {"name": "TF_FLASHNEXT_KV_PAGES", "scope": "flashnext",
                                             "value": "512", "source": "inherited"}
    settings = TABLE.read({"TF_KV_PAGES": "512", "TF_FLASHNEXT_KV_PAGES": "64"}, families=["flashnext"])
    assert (settings["TF_KV_PAGES"], settings["TF_FLASHNEXT_KV_PAGES"]) == (512, 64)
    (problem,) = refusal({"TF_FLASHNEXT_KV_PAGES": "100"}, families=["flashnext"])
    assert problem == "TF_FLASHNEXT_KV_PAGES=100: must be 0 (off) or a multiple of 16 from 16 to 8192"


def test_a_family_rows_form_is_checked_at_once_its_values_when_that_family_loads() -> None:
    # Malformed is refused whatever loads, beside the other scopes' problems.
    assert refusal({"TF_FLASHNEXT_STATE_PAGES": "2", "TF_PORT": "http"}) == (
        "TF_PORT=http: must be an integer from 0 to 65535",
        "TF_FLASHNEXT_STATE_PAGES=2: must be exactly 0 or 1",
    )
    assert refusal({"TF_FLASHNEXT_KV_PAGES": "100"}) == (
        "TF_FLASHNEXT_KV_PAGES=100: must be 0 (off) or a multiple of 16 from 16 to 8192",)
    # Well formed but not applicable alone (pieces need pages): that waits for the family.
    environ = {"TF_FLASHNEXT_STATE_PAGES": "1", "TF_FLASHNEXT_KV_PAGES": "0"}
    settings = TABLE.read(environ)  # a Qwen3.5 start reads it as text
    with pytest.raises(LookupError, match="scope flashnext"):
        settings["TF_FLASHNEXT_STATE_PAGES"]
    settings.check_family("qwen3_5")  # another family loads: no complaint
    settings.check_family("qwen3_next")
    with pytest.raises(SettingsRefused) as refused:
        settings.check_family("qwen4_exp")  # Flash Next's model_type
    assert refused.value.problems == (
        "TF_FLASHNEXT_STATE_PAGES=1 requires TF_FLASHNEXT_KV_PAGES, which is 0 (off)",)
    assert TABLE.read(environ, families=["qwen3_5"]).checked_scopes.isdisjoint({"flashnext"})
    with pytest.raises(ValueError, match="llama"):
        settings.check_family("llama")


def test_flag_beats_environment_and_meets_the_same_check() -> None:
    parser = build_parser(TABLE)
    args = parser.parse_args(["serve", "--port", "9001", "--no-flashnext-state-pages"])
    settings = TABLE.read({"TF_PORT": "9000", "TF_FLASHNEXT_STATE_PAGES": "1"},
                          TABLE.flag_values(args), families=["flashnext"])
    assert settings["TF_PORT"] == 9001
    assert settings.source("TF_PORT") == "flag"
    assert settings["TF_FLASHNEXT_STATE_PAGES"] is False
    args = parser.parse_args(["serve", "--port", "http", "--flashnext-state-pages",
                              "--flashnext-kv-pages", "0"])
    problems = refusal({}, flags=TABLE.flag_values(args), families=["flashnext"])
    assert problems == (
        "--port http (TF_PORT): must be an integer from 0 to 65535",
        "--flashnext-state-pages 1 (TF_FLASHNEXT_STATE_PAGES) requires TF_FLASHNEXT_KV_PAGES, "
        "which is 0 (off)",
    )


def test_an_empty_flag_unsets_the_environment() -> None:
    args = build_parser(TABLE).parse_args(["serve", "--http-socket", ""])
    settings = TABLE.read({"TF_HTTP_SOCKET": "/run/x.sock"}, TABLE.flag_values(args))
    assert settings["TF_HTTP_SOCKET"] is None
    assert settings.source("TF_HTTP_SOCKET") == "flag"


def test_secrets_have_no_flag_and_are_masked() -> None:
    assert TABLE.by_name()["TF_API_KEYS"].flag is None
    rows = {row["name"]: row for row in TABLE.read({"TF_API_KEYS": "sk-123"}).effective()}
    assert rows["TF_API_KEYS"]["value"] == MASK
    assert rows["TF_PORT"] == {"name": "TF_PORT", "scope": "server", "value": "8000", "source": "default"}
    assert "TF_FLASHNEXT_KV_PAGES" not in rows  # a family scope not checked is not effective


def test_unprintable_values_are_shown_escaped() -> None:
    (problem,) = refusal({"TF_PORT": "80\n\x1b[31m"})
    assert problem == "TF_PORT='80\\n\\x1b[31m': must be an integer from 0 to 65535"
    (problem,) = refusal({"TF_PORT": "9" * 500})
    assert len(problem) < 150


@settings(max_examples=300, deadline=None)
@given(row=st.sampled_from(TABLE.rows), text=st.text(max_size=120),
       as_flag=st.booleans())
def test_any_value_of_any_row_is_accepted_or_refused_by_name(row: object, text: str,
                                                              as_flag: bool) -> None:
    from tfd.env_rows import Row

    assert isinstance(row, Row)
    flags = {row.name: text} if as_flag and row.flag else {}
    environ = {} if flags else {row.name: text}
    try:
        TABLE.read(environ, flags, families=FAMILY_SCOPES)
    except SettingsRefused as refused:
        assert refused.problems
        assert all(row.name in problem for problem in refused.problems)


@pytest.mark.parametrize(("name", "spec", "match"), [
    ("TF_X", 'kind = "int"\nmin = 0\nmax = 1\nhelp = "h"\nmaxx = 3', "unknown keys"),
    ("TF_X", 'kind = "int"\nmin = 0\nmax = 1\ndefault = "2"\nhelp = "h"', "from 0 to 1"),
    ("TF_X", 'kind = "switch"\nrequires = "TF_NOPE"\nhelp = "h"', "requires unknown TF_NOPE"),
    ("TF_X", 'kind = "colour"\nhelp = "h"', "unknown kind"),
    ("TF_X", 'kind = "int"\nmin = 0.5\nmax = 1\nhelp = "h"', "whole"),
    ("tf_x", 'kind = "switch"\nhelp = "h"', "upper case"),
    ("TF_LOG", 'kind = "switch"\nhelp = "h"', "another program"),
    ("TF_X", 'kind = "switch"\ninherits = "TF_NOPE"\nhelp = "h"', "inherits TF_NOPE"),
    ("TF_X", 'kind = "switch"\nneeds = {row = "TF_CONTEXT"}\nhelp = "h"', "a list of tables"),
    ("TF_X", 'kind = "switch"\nneeds = [{row = "TF_CONTEXT", why = "w", above = 1, at_least = 2}]\n'
     'help = "h"', "one bound"),
    ("TF_X", 'kind = "switch"\nneeds = [{row = "TF_CONTEXT", above = 1}]\nhelp = "h"', "a why"),
    ("TF_X", 'kind = "switch"\nneeds = [{row = "TF_NOPE", why = "w", above = 1}]\nhelp = "h"',
     "needs unknown"),
])
def test_a_malformed_table_is_refused_at_load(tmp_path: Path, name: str, spec: str, match: str) -> None:
    (tmp_path / "foreign.toml").write_text((ROOT / "env" / "foreign.toml").read_text())
    (tmp_path / "core.toml").write_text(f"[{name}]\n{spec}\n")
    with pytest.raises((TypeError, ValueError), match=match):
        Table.load(tmp_path)


def test_environment_markdown_is_current() -> None:
    committed = (ROOT / "docs" / "environment.md").read_text()
    assert committed == render_markdown(TABLE), "run: tfd env --markdown > docs/environment.md"


def test_environment_file_is_current() -> None:
    committed = (ROOT / "env" / "tfd.env").read_text()
    assert committed == render_envfile(TABLE), "run: tfd env --env-file > env/tfd.env"


def test_environment_file_defaults_read_back_as_the_defaults() -> None:
    lines = render_envfile(TABLE).splitlines()
    assigned = dict(line[1:].split("=", 1) for line in lines if line.startswith("#TF_"))
    assert set(assigned) == {row.name for row in TABLE.rows}
    # Uncommenting every line unchanged gives the defaults: no row changes meaning.
    uncommented = TABLE.read(assigned, families=FAMILY_SCOPES)
    assert uncommented.values == TABLE.read({}, families=FAMILY_SCOPES).values
