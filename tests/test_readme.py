"""The README as a new user reads it: its walkthrough runs as written, its links stay inside
the repository."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from car_ray.cli import app

from .conftest import ROOT

README = ROOT / "README.md"
_FENCE = r"\n```[a-z]*\n(.*?)\n```"


def walkthrough(text: str) -> tuple[dict[str, str], list[list[str]]]:
    """The files (`<!-- walkthrough file: PATH -->` before a fenced block) and the commands
    (the block after `<!-- walkthrough commands -->`) of the README's walkthrough."""
    files = dict(re.findall(r"<!-- walkthrough file: (\S+) -->" + _FENCE, text, re.S))
    (block,) = re.findall(r"<!-- walkthrough commands -->" + _FENCE, text, re.S)
    commands = [shlex.split(line) for line in block.splitlines() if line.strip()]
    return files, commands


@pytest.mark.usefixtures("ray_local")
def test_the_readme_walkthrough_records_a_bad_run_and_names_the_step_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files, commands = walkthrough(README.read_text())
    assert set(files) == {"my_agent/agent.py", "my_agent/policy.py", "my_agent/job.toml"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    monkeypatch.chdir(tmp_path)
    cli = CliRunner()
    outputs = []
    for argv in commands:
        assert argv[0] == "car-ray", argv
        result = cli.invoke(app, argv[1:], env={"COLUMNS": "100"})
        assert result.exit_code == 0, f"{shlex.join(argv)}:\n{result.output}"
        outputs.append(result.output)
    recorded, attributed = outputs
    assert "score 1.00 (bad)" in recorded and (tmp_path / "my_agent" / "umbrella.tape").exists()
    verdict = attributed.strip().splitlines()[-1]
    assert verdict.startswith(
        'verdict: fix step 2, where the model answered "No umbrella needed." (blame φ '
    ), attributed
    assert list((tmp_path / "out").glob("*/attribution.parquet"))


def test_readme_and_docs_link_only_files_in_the_repository() -> None:
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{page.name} links {target}: outside the repo"
            assert resolved.exists(), f"{page.name} links {target}: no such file"


def framework_blocks(text: str) -> dict[str, str]:
    """The README's "Your framework" agents (`<!-- framework: NAME -->` before a block)."""
    return dict(re.findall(r"<!-- framework: (\S+) -->" + _FENCE, text, re.S))


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("framework", ["agents", "langchain", "pydantic-ai", "mcp"])
def test_each_framework_block_records_and_names_the_step_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, framework: str
) -> None:
    """Each block, as the walkthrough's agent (its policy, its job with the block's scorer):
    `record --until-bad` then `attribute` name the answer, step 2, as the step to fix."""
    files, _ = walkthrough(README.read_text())
    blocks = framework_blocks(README.read_text())
    assert set(blocks) == {"agents", "langchain", "pydantic-ai", "mcp"}
    folder = tmp_path / "my_agent"
    folder.mkdir()
    (folder / "agent.py").write_text(blocks[framework] + "\n")
    (folder / "policy.py").write_text(files["my_agent/policy.py"] + "\n")
    job = files["my_agent/job.toml"].replace("told_to_stay_dry", "said_no_umbrella")
    (folder / "job.toml").write_text(job + "\n")
    monkeypatch.chdir(tmp_path)
    for name in [m for m in sys.modules if m == "my_agent" or m.startswith("my_agent.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's my_agent
    recorded = _car_ray(framework, "record", "my_agent/job.toml", "--until-bad")
    assert "score 1.00 (bad)" in recorded
    attributed = _car_ray(framework, "attribute", "my_agent/job.toml")
    verdict = attributed.strip().splitlines()[-1]
    assert verdict.startswith("verdict: fix step 2, where the model answered"), verdict


def _car_ray(framework: str, *argv: str) -> str:
    """`car-ray ARGV` in this folder: its output, once it exited 0. The MCP agent's stdio
    server writes its errors to the process's stderr, which CliRunner replaces with a stream
    that has no file descriptor: that one runs as a process of its own."""
    if framework != "mcp":
        result = CliRunner().invoke(app, list(argv), env={"COLUMNS": "100"})
        assert result.exit_code == 0, f"{argv}:\n{result.output}"
        return result.output
    env = {**os.environ, "COLUMNS": "100", "RAY_USAGE_STATS_ENABLED": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "car_ray.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout
