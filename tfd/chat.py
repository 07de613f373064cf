"""A checkpoint's chat template: Jinja source rendered in a sandbox, as Hugging Face renders it.

``find_chat_template`` reads the source from a checkpoint directory: ``chat_template.jinja``, else
``tokenizer_config.json``'s ``chat_template`` (text, or a list of named templates of which
"default" is taken), with the ``bos_token`` and ``eos_token`` named there. Rendering runs in
jinja2's ``ImmutableSandboxedEnvironment``: a template reads its inputs but cannot reach Python
internals (``__class__`` and the like) nor mutate lists and dicts. Templates see
``raise_exception(message)``, a ``tojson`` filter that keeps non-ASCII text, and
``strftime_now(format)``. Every failure, at parse or at render, is a ``ChatTemplateError`` naming
where the template came from.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

import attrs
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(Exception):
    """A chat template that does not parse, or that refused or failed on the given messages.

    ``message`` is the text of a template's own ``raise_exception`` call (a refusal of the
    messages, fit to show to the client), else the whole description of the failure.
    """

    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


def _raise_exception(message: object) -> NoReturn:
    raise ChatTemplateError(str(message))


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML; a prompt must get the JSON as it is.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    # trim_blocks and lstrip_blocks as Hugging Face sets them: templates are written for that.
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=[jinja2.ext.loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


_ENVIRONMENT = _environment()
_RENDER_FAILURES = (jinja2.TemplateError, ArithmeticError, LookupError, TypeError, ValueError)


@attrs.frozen
class ChatTemplate:
    """A compiled chat template; ``origin`` names where its source came from, for messages."""

    source: str
    origin: str
    bos_token: str | None = None
    eos_token: str | None = None
    _template: jinja2.Template = attrs.field(eq=False, repr=False, kw_only=True)

    @classmethod
    def parse(cls, source: str, origin: str, bos_token: str | None = None,
              eos_token: str | None = None) -> ChatTemplate:
        """Compile ``source``; a syntax error raises ``ChatTemplateError`` naming ``origin`` and line."""
        try:
            template = _ENVIRONMENT.from_string(source)
        except jinja2.TemplateSyntaxError as error:
            raise ChatTemplateError(f"{origin}: chat template does not parse: line {error.lineno}: "
                                    f"{error.message}") from error
        return cls(source, origin, bos_token, eos_token, template=template)

    def render(self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True,
               **kwargs: object) -> str:
        """The prompt for ``messages``; ``kwargs`` (``tools``, ``enable_thinking``...) reach the template.

        ``bos_token`` and ``eos_token`` are passed when the checkpoint names them; ``kwargs`` may
        override them. A template's ``raise_exception`` raises ``ChatTemplateError`` carrying its
        message; any other failure (sandbox refusal, undefined value, a type error inside the
        template) raises ``ChatTemplateError`` naming ``origin``, the original as its cause.
        """
        context: dict[str, object] = {"messages": messages, "add_generation_prompt": add_generation_prompt}
        if self.bos_token is not None:
            context["bos_token"] = self.bos_token
        if self.eos_token is not None:
            context["eos_token"] = self.eos_token
        context.update(kwargs)
        try:
            return self._template.render(context)
        except ChatTemplateError:
            raise
        except _RENDER_FAILURES as error:
            raise ChatTemplateError(f"{self.origin}: chat template failed: "
                                    f"{type(error).__name__}: {error}") from error


def find_chat_template(directory: Path, override: Path | None = None) -> ChatTemplate | None:
    """The template of a checkpoint directory, compiled; None when it has none.

    ``override`` (a Jinja file: TF_CHAT_TEMPLATE) wins over the checkpoint's own, then
    chat_template.jinja over tokenizer_config.json's ``chat_template``; the special tokens are the
    checkpoint's either way. Raises
    ``ChatTemplateError`` naming the file for an unreadable tokenizer_config.json, a list of
    templates without "default", a special token of the wrong form, or a template that does not
    parse.
    """
    config_path = directory / "tokenizer_config.json"
    config: object = {}
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ChatTemplateError(f"{config_path}: unreadable: {error}") from error
    if not isinstance(config, dict):
        raise ChatTemplateError(f"{config_path}: must hold a JSON object")
    bos = _token_text(config.get("bos_token"), config_path)
    eos = _token_text(config.get("eos_token"), config_path)
    jinja_path = directory / "chat_template.jinja"
    if override is not None or jinja_path.is_file():
        jinja_path = override or jinja_path
        try:
            text = jinja_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ChatTemplateError(f"{jinja_path}: unreadable: {error}") from error
        return ChatTemplate.parse(text, str(jinja_path), bos, eos)
    source: object = config.get("chat_template")
    if source is None:
        return None
    if isinstance(source, list):
        named = {entry.get("name"): entry.get("template") for entry in source if isinstance(entry, dict)}
        source = named.get("default")
        if source is None:
            raise ChatTemplateError(f"{config_path}: chat_template lists no template named 'default' "
                                    f"(names: {sorted(map(str, named))})")
    if not isinstance(source, str):
        raise ChatTemplateError(f"{config_path}: chat_template must be text or a list of "
                                f"{{name, template}}, not {type(source).__name__}")
    return ChatTemplate.parse(source, f"{config_path} (chat_template)", bos, eos)


def _token_text(value: object, path: Path) -> str | None:
    # tokenizer_config.json writes a special token as text or as an AddedToken object.
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise ChatTemplateError(f"{path}: special token {value!r} is neither text nor {{content: text}}")
