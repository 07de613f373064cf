"""A checkpoint's chat template: where it is found, how it renders, the sandbox it renders in."""

from __future__ import annotations

from pathlib import Path

import jinja2.exceptions
import pytest
from checkpoint_files import make_checkpoint, write_json

from tfd.chat import ChatTemplateError, find_chat_template
from tfd.checkpoint import open_checkpoint

QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_the_template_of_tokenizer_config_renders_with_and_without_a_generation_prompt(
        tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    assert checkpoint.chat_template() is None
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": QWEN_TEMPLATE})
    template = checkpoint.chat_template()
    assert template is not None
    turns = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert template.render(MESSAGES) == turns + "<|im_start|>assistant\n"
    assert template.render(MESSAGES, add_generation_prompt=False) == turns


def test_chat_template_jinja_wins_and_sees_tokens_and_kwargs(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    write_json(tmp_path / "tokenizer_config.json", {
        "chat_template": QWEN_TEMPLATE, "bos_token": None,
        "eos_token": {"content": "<|im_end|>", "lstrip": False, "special": True}})
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token is defined }} {{ eos_token }}\n"
        "{% if enable_thinking is defined and not enable_thinking %}no-think{% endif %}")
    template = checkpoint.chat_template()
    assert template is not None and template.origin == str(tmp_path / "chat_template.jinja")
    assert template.render(MESSAGES, enable_thinking=False) == "False <|im_end|>\nno-think"


def test_a_list_of_templates_gives_the_default_one(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": [
        {"name": "tool_use", "template": "tools"}, {"name": "default", "template": "plain"}]})
    template = checkpoint.chat_template()
    assert template is not None and template.render(MESSAGES) == "plain"


def test_raise_exception_becomes_a_chat_template_error_with_its_message(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    (tmp_path / "chat_template.jinja").write_text(
        "{% if messages[0].role != 'user' %}{{ raise_exception('First message must be user') }}{% endif %}")
    template = checkpoint.chat_template()
    assert template is not None
    with pytest.raises(ChatTemplateError) as caught:
        template.render(MESSAGES)
    assert caught.value.message == "First message must be user"


def test_tojson_keeps_non_ascii_and_strftime_now_formats(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    (tmp_path / "chat_template.jinja").write_text(
        "{{ tools | tojson }}|{{ strftime_now('%Y') | length }}")
    template = checkpoint.chat_template()
    assert template is not None
    assert template.render([], tools=[{"name": "météo", "x": "<&>"}]) == '[{"name": "météo", "x": "<&>"}]|4'


def test_the_sandbox_hides_internals_and_refuses_reaching_through_them(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    (tmp_path / "chat_template.jinja").write_text("[{{ ''.__class__ }}]")
    template = checkpoint.chat_template()
    assert template is not None and template.render([]) == "[]"  # an unsafe attribute is undefined
    for source in ["{{ ''.__class__.__mro__ }}", "{{ messages.append(1) }}"]:
        (tmp_path / "chat_template.jinja").write_text(source)
        template = checkpoint.chat_template()
        assert template is not None
        with pytest.raises(ChatTemplateError, match="unsafe") as caught:
            template.render([])
        assert isinstance(caught.value.__cause__, jinja2.exceptions.SecurityError)
        assert str(tmp_path / "chat_template.jinja") in str(caught.value)


def test_a_template_that_does_not_parse_is_refused_naming_the_file(tmp_path: Path) -> None:
    checkpoint = open_checkpoint(make_checkpoint(tmp_path))
    write_json(tmp_path / "tokenizer_config.json", {"chat_template": "{% for m in messages %}"})
    with pytest.raises(ChatTemplateError, match=r"tokenizer_config\.json") as caught:
        checkpoint.chat_template()
    assert "line 1" in str(caught.value)
    (tmp_path / "chat_template.jinja").write_text("\n{{ }")
    with pytest.raises(ChatTemplateError, match=r"chat_template\.jinja: .*line 2"):
        checkpoint.chat_template()


def test_an_override_file_wins_over_the_checkpoints_template_and_keeps_its_tokens(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "model")
    write_json(directory / "tokenizer_config.json", {"chat_template": QWEN_TEMPLATE, "bos_token": "<s>"})
    (directory / "chat_template.jinja").write_text("{{ 'jinja' }}")
    override = tmp_path / "mine.jinja"
    override.write_text("{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}")
    template = find_chat_template(directory, override)
    assert template is not None and template.origin == str(override)
    assert template.render(MESSAGES) == "<s>[system] Be brief.[user] Hi"
    checkpoint = find_chat_template(directory)  # without one: the checkpoint's own
    assert checkpoint is not None and checkpoint.render(MESSAGES) == "jinja"


def test_an_override_that_cannot_be_read_or_parsed_is_refused_naming_it(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "model")
    with pytest.raises(ChatTemplateError, match=f"{tmp_path / 'missing.jinja'}: unreadable"):
        find_chat_template(directory, tmp_path / "missing.jinja")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for %}")
    with pytest.raises(ChatTemplateError, match=f"{broken}: chat template does not parse"):
        find_chat_template(directory, broken)
