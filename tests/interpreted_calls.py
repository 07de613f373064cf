"""Triton's interpreter without patching triton.language again for every call of a jit helper.

Under TRITON_INTERPRET=1 a launch patches triton.language's builtins for its run (``_patch_lang``)
and restores them after; a ``@triton.jit`` helper called from a kernel patches them again on every
call, that is in every program of every launch (inspect.getmembers over tl, tl.core, tl.math and the
tensor classes: a quarter to a third of an interpreted kernel test's time). While a launch runs, the
modules a helper sees are already patched, so that second patching finds every builtin replaced and
sets only attributes to what they already do. ``install`` keeps Triton's call and skips only that
patching, and only where every triton.language module the helper sees is patched now; elsewhere the
call is Triton's own.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import Any


def install() -> bool:
    """Replace ``InterpretedFunction.__call__`` (a helper's call in a kernel); False where this
    Triton's interpreter is not the one this was written against (its call then stays as it is)."""
    from triton.runtime import interpreter

    function = getattr(interpreter, "InterpretedFunction", None)
    needed = ("_patch_lang", "InterpreterError")
    if function is None or not all(hasattr(interpreter, name) for name in needed):
        return False
    source = inspect.getsource(function.__call__)
    if "_patch_lang(self.fn)" not in source or "self.rewrite()" not in source:
        return False

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:  # Triton's, less the repeated patching
        if not _patched_now(self.fn):
            interpreter._patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    function.__call__ = call
    return True


def _patched_now(fn: Any) -> bool:
    """Whether each triton.language module in ``fn``'s globals (those ``_patch_lang`` patches) has
    its builtins replaced now: a launch that saw it is running."""
    import triton.language as tl

    languages: list[ModuleType] = [value for value in fn.__globals__.values()
                                   if inspect.ismodule(value) and value in (tl, tl.core)]
    # _patch_lang replaces a module's builtins all together: program_id stands for the rest
    return bool(languages) and not any(tl.core.is_builtin(language.program_id) for language in languages)
