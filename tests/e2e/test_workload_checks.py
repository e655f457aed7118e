"""Model files that mislead (issue 14, defect 6): each gets one line naming the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli_checks import assert_fails

HEADER = """
import sys
import torch
from torch import nn
from profiles.workload import Workload


class Net(nn.Module):
    def __init__(self, dropout=0.0):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(4, 4), nn.Linear(4, 2), nn.Dropout(dropout)

    def forward(self, x):
        return self.b(self.drop(torch.relu(self.a(x))))


def batch(n):
    return torch.randn(n, 4), torch.randn(n, 2)
"""

CASES = {
    "returns a dict without a tensor": (
        "class Out(Net):\n    def forward(self, x):\n        return {'logits': [1.0], 'n': 3}\n"
        "def w():\n    return Workload(Out(), batch, nn.functional.mse_loss, units=('a', 'b'))\n",
        "returned a dict with no tensor in it",
    ),
    "returns a string": (
        "class Out(Net):\n    def forward(self, x):\n        return 'logits'\n"
        "def w():\n    return Workload(Out(), batch, nn.functional.mse_loss, units=('a', 'b'))\n",
        "the model returned str: return a tensor, a ModelOutput, a dict or a tuple",
    ),
    "wrong shapes": (
        "def w():\n    return Workload(Net(), lambda n: (torch.randn(n, 7), torch.randn(n, 2)), "
        "nn.functional.mse_loss, units=('a', 'b'))\n",
        "the model's forward failed on make_batch(1)'s inputs (shapes [(1, 7)])",
    ),
    "keyword-only argument": (
        "class Out(Net):\n    def forward(self, x, *, mask):\n        return super().forward(x)\n"
        "def w():\n    return Workload(Out(), batch, nn.functional.mse_loss, units=('a', 'b'))\n",
        "Out.forward has required keyword-only arguments (mask)",
    ),
    "ignores the batch size": (
        "def w():\n    return Workload(Net(), lambda n: batch(8), nn.functional.mse_loss, units=('a', 'b'))\n",
        "make_batch(1) returned input 0 of shape (8, 4): its first dimension must be the batch size 1",
    ),
    "sys.exit at import": ("sys.exit(0)\ndef w():\n    pass\n", "called sys.exit(0): a model file must not exit"),
    "sys.exit in the factory": ("def w():\n    sys.exit(3)\n", "called sys.exit(3): it must return a Workload"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model_file_problems_are_one_line(tmp_path: Path, capsys, existing, name: str) -> None:
    body, message = CASES[name]
    model = tmp_path / "model.py"
    model.write_text(HEADER + body)
    argv = [
        "profile",
        f"{model}:w",
        "--micro-batch-sizes",
        "1,2",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--no-pipeline-run",
    ]
    assert_fails(capsys, [*argv, "--no-progress", "--out", existing], message, existing)


def test_profile_out_refuses_the_model_file(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model.py"
    model.write_text(HEADER + "def w():\n    return Workload(Net(), batch, nn.functional.mse_loss)\n")
    before = model.read_text()
    assert_fails(capsys, ["profile", f"{model}:w", "--out", model], "is this command's input")
    assert model.read_text() == before


def test_active_dropout_is_a_warning(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model.py"
    model.write_text(
        HEADER + "def w():\n    return Workload(Net(0.1), batch, nn.functional.mse_loss, units=('a', 'b'))\n"
    )
    out = tmp_path / "p.json"
    from cli import main

    argv = ["profile", f"{model}:w", "--micro-batch-sizes", "1", "--repeats", "1", "--warmup", "0", "--no-progress"]
    argv.append("--no-pipeline-run")
    assert main([*argv, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: 1 dropout modules are active in training mode (e.g. drop)" in err
    assert out.exists()
