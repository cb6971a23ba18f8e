"""``--version``, shell completion and a help text for every flag."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from hcs.cli import build_parser
from tests.cli.running import hcs


def test_version_comes_from_the_package_metadata() -> None:
    done = hcs("--version")
    assert done.code == 0, done.err
    assert done.out.strip() == f"hcs {metadata.version('hcs')}"


def _complete(script: Path, words: list[str]) -> list[str]:
    """What bash offers after ``words`` (the last one being typed)."""
    bash = shutil.which("bash")
    assert bash, "bash is not on PATH"
    quoted = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; "
        f'COMP_LINE="{" ".join(words)}"; COMP_POINT=${{#COMP_LINE}}; '
        f"_shtab_hcs hcs '{words[-1]}' '{words[-2]}'; printf '%s\\n' \"${{COMPREPLY[@]}}\""
    )
    done = subprocess.run([bash, "-c", program], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    done = hcs("completion", "bash")
    assert done.code == 0, done.err
    script = tmp_path_factory.mktemp("completion") / "hcs.bash"
    script.write_text(done.out)
    return script


def test_bash_completes_commands_and_their_flags(bash_script: Path) -> None:
    assert _complete(bash_script, ["hcs", "pl"]) == ["place"]
    assert _complete(bash_script, ["hcs", "place", "--sub"]) == ["--substitution"]
    assert "--nats-url" in _complete(bash_script, ["hcs", "watch", "--n"])


@pytest.mark.parametrize("shell", ["zsh", "tcsh"])
def test_other_shells_get_a_script_naming_every_command(shell: str) -> None:
    done = hcs("completion", shell)
    assert done.code == 0, done.err
    for command in ("up", "top", "bus", "models", "convert", "place", "watch", "certs"):
        assert command in done.out


def _parsers(parser: argparse.ArgumentParser, path: str = "hcs") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _parsers(sub, f"{path} {name}")
    return found


def test_every_flag_and_argument_of_every_command_has_a_help_text() -> None:
    missing = [
        f"{path} {action.option_strings or action.dest}"
        for path, parser in _parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, argparse._SubParsersAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []


def test_every_command_has_a_help_page() -> None:
    for path, _parser in _parsers(build_parser()):
        done = hcs(*path.split()[1:], "--help")
        assert done.code == 0 and "usage: " in done.out, (path, done.err)
