"""Commands that need no torch start without it: ``pipeplan --version``, ``plan``, ``show``, ``simulate``,
``export`` and ``check`` run in a process that never imports torch (nor its stack: the CLI's start is what a
script that plans many what-ifs pays every time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from synthetic import transformer_profile

ROOT = Path(__file__).resolve().parents[1]

_RUN = """
import json
import sys
sys.path.insert(0, {root!r})
from cli import main
codes = [main(argv) for argv in {commands!r}]
heavy = sorted(m for m in ("torch", "transformers", "fvcore") if m in sys.modules)
print(json.dumps({{"codes": codes, "heavy": heavy}}))
"""


def test_planning_commands_never_import_torch(tmp_path: Path) -> None:
    profile = tmp_path / "p.profile.json"
    profile.write_text(json.dumps(transformer_profile("gpt2", layers=6).to_dict()))
    plan, timeline = str(tmp_path / "p.plan.json"), str(tmp_path / "t.png")
    commands = [
        ["plan", str(profile), "--ranks", "2", "--global-batch", "8", "--for", "megatron", "--out", plan],
        ["show", plan],
        ["show", "h100-80gb"],
        ["simulate", plan, "--compare", "gpipe,1f1b", "--out", timeline],
        ["export", plan, "--to", "megatron", "--out", str(tmp_path / "m.txt")],
        ["check", str(profile), "--from", "megatron", str(tmp_path / "m.txt")],
    ]
    code = _RUN.format(root=str(ROOT), commands=commands)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"codes": [0, 0, 0, 0, 0, 0], "heavy": []}, done.stderr[-2000:]


def test_version_answers_without_the_planner() -> None:
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        "from cli import main\n"
        "try:\n    main(['--version'])\nexcept SystemExit as stop:\n    assert stop.code == 0\n"
        "print(sorted(m for m in ('torch', 'networkx', 'highspy', 'pulp', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert done.stdout.startswith("pipeplan ")


def test_a_plan_without_the_ilp_or_a_trainer_loads_neither(tmp_path: Path) -> None:
    # pulp is the ILP's modeller (the search's floors call HiGHS directly), the exporters are `--for`'s: a plan that
    # asks for neither pays for neither at start-up.
    profile = tmp_path / "p.profile.json"
    profile.write_text(json.dumps(transformer_profile("gpt2", layers=6).to_dict()))
    argv = ["plan", str(profile), "--ranks", "4", "--global-batch", "16", "--out", str(tmp_path / "p.plan.json")]
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
        f"from cli import main\nassert main({argv!r}) == 0\n"
        "print(sorted(m for m in ('pulp', 'planner.trainer_rules', 'highspy') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # HiGHS, for the orders' floor, only where that floor could prune (planner/bounds.py): not needed here.
    assert done.stdout.strip().splitlines()[-1] == "[]"
