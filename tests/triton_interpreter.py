"""Triton's interpreter for dormouse's Triton kernels on a machine without CUDA (CI's), so that
tests/test_kernels_interpreted.py runs every kernel against float64 on CPU tensors.

tests/conftest.py sets TRITON_INTERPRET=1 (Triton reads it when a kernel is defined, so before any test
imports a kernel module). `fix()` fixes two places where triton 3.6's interpreter fails these kernels
(wrapping its `_patch_lang_*` hooks, which it applies while a kernel runs):
- a scalar loaded from memory and used as a bound of Python's `range` (the row sums' loop) is a
  one-element array, which NumPy 2.4 no longer turns into an int (`__index__`; triton 3.8 squeezes it
  the same way);
- `tl.range`'s induction variable is a Python int, where compiled code has a tensor: the conv kernels'
  `t.to(tl.int64)` fails on it. Here it is an int32 tensor, as compiled.
The interpreter computes in NumPy: fp32 arithmetic as a GPU's (not its summation order), and bf16 stores
by truncation, not rounding to nearest: a bf16 output is within 2^-7 of float64, not the GPU's 2^-8.
"""

import os

import numpy as np
import triton
from triton.runtime import interpreter

TRITON_VERSION = "3.6.0"  # the GPU machine's; pyproject's dev extra pins the same


def fix() -> None:
    """Apply the fixes; refused where the interpreter is off or Triton is another version."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("TRITON_INTERPRET=1 is set by tests/conftest.py where there is no CUDA")
    if triton.__version__ != TRITON_VERSION:
        raise RuntimeError(f"these fixes are for triton {TRITON_VERSION}'s interpreter; found {triton.__version__}")
    patch_tensor, patch_core = interpreter._patch_lang_tensor, interpreter._patch_lang_core

    def _patch_lang_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    def _patch_lang_core(lang, scope):
        patch_core(lang, scope)

        def tensor_range(arg1, arg2=None, step=None, **kwargs):
            start, end = (0, arg1) if arg2 is None else (arg1, arg2)
            for i in range(start, end, 1 if step is None else step):
                yield lang.tensor(interpreter.TensorHandle(np.array(i, dtype=np.int32), lang.int32), lang.int32)

        scope.set_attr(lang, "range", tensor_range)

    interpreter._patch_lang_tensor, interpreter._patch_lang_core = _patch_lang_tensor, _patch_lang_core
