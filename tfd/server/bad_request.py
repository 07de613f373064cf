"""The refusal of a malformed request: a 400 naming the field at fault."""

from __future__ import annotations


class BadRequest(Exception):
    """A 400: ``param`` is the field at fault, ``code`` the OpenAI error code."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request_error") -> None:
        self.param = param
        self.code = code
        super().__init__(message)
