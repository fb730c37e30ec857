"""Pytest setup shared by all tests.

Triton's CPU interpreter must be chosen before triton is imported anywhere in the process
(docs/design.md §7): without a CUDA device, the Triton kernel tests run in the interpreter. The
variable only changes how Triton kernels execute; nothing else reads it.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
