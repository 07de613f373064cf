"""The contract with tool calls, where the server's chat template takes tools.

A call forced by ``tool_choice: "required"`` (its grammar in the template's own format) is drawn
greedily and seeded: repeat; concurrent == solo at each of the profile's levels, drafts on and off;
drafted == plain; and resumed == fresh for the turn after it (the call, the tool's result, the model
free to answer or call again). A template that takes no tools must refuse them by name: one row,
which holds when it does.
"""

from __future__ import annotations

import functools
from typing import Any

from tfd.conformance.client import Answer, Client
from tfd.conformance.gates import SAMPLINGS, Profile, cached, sha, side_by_side
from tfd.conformance.report import Row

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "A city's forecast.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
        },
    },
}
CALL_TOKENS = 96  # room for a call of WEATHER's bounded arguments
KINDS = ("greedy", "seeded")


class ToolGate:
    """The tool rows of ``profile`` against ``client``."""

    def __init__(self, client: Client, profile: Profile) -> None:
        self.client = client
        self.profile = profile

    def messages(self, index: int) -> list[dict[str, Any]]:
        return [
            {
                "role": "user",
                "content": f"What is the weather in city number {index} for {index % 7 + 1} days?",
            }
        ]

    def call(
        self, messages: list[dict[str, Any]], sampling: str, choice: str = "required", **extra: Any
    ) -> Answer:
        body = {
            "messages": messages,
            "tools": [WEATHER],
            "tool_choice": choice,
            "max_tokens": CALL_TOKENS,
            "chat_template_kwargs": {"enable_thinking": False},
            **{key: value for key, value in SAMPLINGS[sampling].items() if key != "ignore_eos"},
            **extra,
        }
        return self.client.post("/v1/chat/completions", body)

    def call_about(self, index: int, sampling: str, **extra: Any) -> Answer:
        """``call`` of prompt ``index``'s messages."""
        return self.call(self.messages(index), sampling, **extra)

    def rows(self) -> list[Row]:
        probe = self.call(self.messages(0), "greedy", cache=False)
        error = probe.body.get("error", {})
        if probe.status == 400 and error.get("param") == "tools":
            refused = "takes no tools" in str(error.get("message"))
            return [
                Row(
                    "tools",
                    {"check": "template"},
                    "takes no tools",
                    refused,
                    f"tools refused: {error.get('message')}",
                )
            ]
        return [*self._repeat_and_concurrent(), *self._drafted(), *self._resumed()]

    def _repeat_and_concurrent(self) -> list[Row]:
        rows, solo = [], {}
        for index in range(self.profile.prompts):
            for sampling in KINDS:
                first, second = (self.call(self.messages(index), sampling, cache=False) for _ in range(2))
                solo[index, sampling] = sha(first)
                rows.append(
                    Row(
                        "tools",
                        {"check": "repeat", "prompt": index, "sampling": sampling},
                        sha(first),
                        sha(first) == sha(second) and called(first),
                        f"twice: {sha(first)} {sha(second)}",
                    )
                )
        for level in self.profile.levels:
            for sampling in KINDS:
                for draft in self.profile.drafts:
                    indices = [i % self.profile.prompts for i in range(level)]
                    send = functools.partial(self.call_about, sampling=sampling, cache=False, draft=draft)
                    answers = side_by_side(indices, send)
                    for slot, (index, answer) in enumerate(zip(indices, answers, strict=True)):
                        alone = solo[index, sampling]
                        key = {
                            "check": "concurrent",
                            "prompt": index,
                            "sampling": sampling,
                            "concurrency": level,
                            "slot": slot,
                            "drafts": draft,
                        }
                        rows.append(
                            Row(
                                "tools",
                                key,
                                sha(answer),
                                sha(answer) == alone,
                                f"call {index} {sampling} at {level}: {sha(answer)} alone {alone}",
                            )
                        )
        return rows

    def _drafted(self) -> list[Row]:
        rows = []
        for index in range(self.profile.prompts):
            for sampling in KINDS:
                plain = self.call(self.messages(index), sampling, cache=False, draft=False)
                drafted = self.call(self.messages(index), sampling, cache=False, draft=True)
                rows.append(
                    Row(
                        "tools",
                        {"check": "drafted", "prompt": index, "sampling": sampling},
                        sha(drafted),
                        sha(drafted) == sha(plain) and called(plain),
                        f"drafted {sha(drafted)} plain {sha(plain)}",
                    )
                )
        return rows

    def _resumed(self) -> list[Row]:
        rows = []
        for index in range(self.profile.conversations):
            for sampling in KINDS:
                first = self.call(self.messages(index), sampling)
                message = first.body.get("choices", [{}])[0].get("message", {})
                calls = message.get("tool_calls") or []
                if not calls:
                    rows.append(
                        Row(
                            "tools",
                            {"check": "resumed", "conversation": index, "sampling": sampling},
                            sha(first),
                            False,
                            f"the first turn made no call: {first.body}",
                        )
                    )
                    continue
                turn = [
                    *self.messages(index),
                    message,
                    *(
                        {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 C."}
                        for call in calls
                    ),
                ]
                resumed = self.call(turn, sampling, "auto")
                fresh = self.call(turn, sampling, "auto", cache=False)
                rows.append(
                    Row(
                        "tools",
                        {"check": "resumed", "conversation": index, "sampling": sampling},
                        sha(resumed),
                        sha(resumed) == sha(fresh) and resumed.status == 200,
                        f"resumed ({cached(resumed)} cached) {sha(resumed)}, fresh {sha(fresh)}",
                    )
                )
        return rows


def called(answer: Answer) -> bool:
    """Whether a reply is a call (it asked for one: ``required``)."""
    choice = answer.body.get("choices", [{}])[0]
    return (
        answer.status == 200
        and choice.get("finish_reason") == "tool_calls"
        and bool(choice.get("message", {}).get("tool_calls"))
    )
