"""The code of docs/guide/torch.md ("Using flexformer from PyTorch") runs as written."""
import os
import re

import pytest

torch = pytest.importorskip("torch")

GUIDE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "guide", "torch.md")


def test_the_torch_guide_runs():
    blocks = re.findall(r"```python\n(.*?)```", open(GUIDE).read(), re.S)
    assert len(blocks) == 5
    torch._dynamo.reset()
    scope = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/guide/torch.md, block {i + 1}", "exec"), scope)
    assert scope["params"]["tau"].grad is not None
    assert scope["y"].shape == (2, 100, 64)
    assert scope["cfg_back"] == scope["cfg"]
