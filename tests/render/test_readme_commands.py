"""Every command in README.md runs as printed.

The render-mode line runs as is (it touches no host). Every other `ansible-playbook` line targets a
real cluster, so it runs with --syntax-check: the playbook, the inventory and the options must parse.
"""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
# Indented code lines and `inline code` that start with ansible-playbook.
COMMANDS = sorted({c.strip() for c in re.findall(r"^ {4}(ansible-playbook [^\n]+)$", README, re.M)
                   + re.findall(r"`(ansible-playbook [^`]+)`", README)})


def _run(argv):
    exe = Path(sys.executable).with_name("ansible-playbook")
    argv = [str(exe) if exe.exists() else argv[0]] + argv[1:]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)  # as a reader would run it: only what the line says
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)


def test_readme_has_the_commands():
    assert any("playbooks/render.yml" in c for c in COMMANDS)
    assert "ansible-playbook site.yml -i inventory/prod" in COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_readme_command_runs_as_printed(command):
    argv = shlex.split(command)
    if "playbooks/render.yml" in argv:
        res = _run(argv)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
        out = Path(argv[argv.index("-e") + 1].split("=", 1)[1])
        assert any(out.rglob("*.env")), f"{command}: nothing rendered under {out}"
    else:
        res = _run(argv + ["--syntax-check"])
        assert res.returncode == 0, f"{command} --syntax-check: {res.stdout[-2000:]}{res.stderr[-2000:]}"
