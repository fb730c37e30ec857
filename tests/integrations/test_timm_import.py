"""Importing the timm integration where timm's torchvision is missing: one typed error, no hooks.

Runs in a child process (a fresh ``sys.modules``) whether or not torchvision is installed here:
``sys.modules["torchvision"] = None`` makes ``import torchvision`` fail as it does where it is
missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("timm", reason="the timm extra is not installed")
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys
sys.modules["torchvision"] = None
hooks = list(sys.meta_path)
import torch
from osa_lab.errors import OptionalDependencyError
import osa_lab.integrations.timm as ot
try:
    ot.import_timm()
except OptionalDependencyError as exc:
    print("ERROR", str(exc).replace("\\n", " "))
print("HOOKS", list(sys.meta_path) == hooks, "TIMM", "timm.models" in sys.modules, "DTYPE", torch.get_default_dtype())
"""


def test_missing_torchvision_is_one_typed_line_and_leaves_no_hook():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300, check=True
    )
    error = [line for line in out.stdout.splitlines() if line.startswith("ERROR ")]
    assert len(error) == 1, out.stdout + out.stderr
    assert "timm imports torchvision, which is not installed" in error[0]
    assert "install the torchvision release made for this torch" in error[0]
    assert "HOOKS True TIMM False DTYPE torch.float32" in out.stdout
