"""Every command in README.md runs as printed.

The render-mode line runs as is (it touches no host). Every other `ansible-playbook` line targets a
real cluster, so it runs with --syntax-check: the playbook, the inventory and the options must parse.
"""
import re
import shlex
from pathlib import Path

import pytest

from conftest import readme_render_line, run_as_printed

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
# Indented code lines and `inline code` that start with ansible-playbook.
COMMANDS = sorted({c.strip() for c in re.findall(r"^ {4}(ansible-playbook [^\n]+)$", README, re.M)
                   + re.findall(r"`(ansible-playbook [^`]+)`", README)})


def test_readme_has_the_commands():
    assert any("playbooks/render.yml" in c for c in COMMANDS)
    assert "ansible-playbook site.yml -i inventory/prod" in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs_as_printed(command, request):
    argv = shlex.split(command)
    if "playbooks/render.yml" in argv:
        # The render-mode line is the prod_render fixture: run as printed once, for every render test.
        assert command == readme_render_line()
        out = request.getfixturevalue("prod_render")
        assert any(out.rglob("*.env")), f"{command}: nothing rendered under {out}"
    else:
        res = run_as_printed(argv + ["--syntax-check"])
        assert res.returncode == 0, f"{command} --syntax-check: {res.stdout[-2000:]}{res.stderr[-2000:]}"
