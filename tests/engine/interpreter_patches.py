"""The Triton interpreter's language patches, made once a launch instead of at every device-function call.

The interpreter patches triton.language's builtins (attributes of the modules a kernel's globals hold) when a
kernel launches, and restores them when it ends. At every call of a @triton.jit helper inside the kernel it
runs the same patching again, on modules it finds patched already: the scan alone (inspect.getmembers over
tl, tl.tensor and tl.math) takes about 1.5 ms, half the interpreter's time in a kernel that calls a helper in
its K loop (a 4-bit GEMV made 1,568 such calls in one launch). Here such a call skips the scan when every
language module in the helper's globals is patched already, by the launch it runs in or by an earlier
helper's call (the interpreter never restores those). Every other call is the interpreter's own, so what a
kernel computes is the same.
"""

from __future__ import annotations

import triton.language as tl


def _langs(fn) -> set[int]:
    """The language modules the interpreter patches for `fn`: tl and tl.core where its globals hold them."""
    return {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}


class LangPatches:
    """Wraps the interpreter's launch (GridExecutor.__call__) and its _patch_lang."""

    def __init__(self, interpreter):
        self._patch_lang = interpreter._patch_lang
        self._launch = interpreter.GridExecutor.__call__
        self._empty_scope = interpreter._LangPatchScope
        self._launches: list[set[int]] = []  # the modules each running launch patched
        self._for_good: set[int] = set()  # patched by helpers' calls, never restored
        self._launch_patches_next = False

    def launch(self, executor, *args, **kwargs):
        self._launches.append(_langs(executor.fn))
        self._launch_patches_next = True  # the launch's own _patch_lang call comes next
        try:
            return self._launch(executor, *args, **kwargs)
        finally:
            self._launches.pop()
            self._launch_patches_next = False

    def patch_lang(self, fn):
        if self._launch_patches_next:
            self._launch_patches_next = False
            return self._patch_lang(fn)
        patched = self._for_good.union(*self._launches)
        langs = _langs(fn)
        if self._launches and langs <= patched:
            return self._empty_scope()  # a helper's call with nothing left to patch; its scope is dropped
        scope = self._patch_lang(fn)
        self._for_good |= langs - patched
        return scope

    def install(self, monkeypatch, interpreter) -> None:
        launch = self.launch
        monkeypatch.setattr(interpreter.GridExecutor, "__call__", lambda executor, *a, **k: launch(executor, *a, **k))
        monkeypatch.setattr(interpreter, "_patch_lang", self.patch_lang)
