"""No path of one developer's machine goes into the repo: every tracked file is grepped for
absolute paths under a home or work directory. Two /root paths are the lab's own, not a machine's:
/root/.cache/pd-lab, PD_LAB_CACHE's default where molecule cannot nest ${HOME} (docs/lab-notes.md),
and /root/.ssh inside the RDMA lab's VM image."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MACHINE = re.compile(r"(?<![\w.$})/])(/work/|/home/[\w.-]+/|/Users/|/root/(?!\.ssh\b|\.cache/pd-lab\b))")


def offending_lines(text):
    return [line for line in text.splitlines()
            if MACHINE.search(line)]


def test_no_machine_paths_in_tracked_files():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    found = []
    for name in filter(None, files.decode().split("\0")):
        path = REPO / name
        if path == Path(__file__).resolve():  # its own examples below
            continue
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{name}: {line.strip()[:160]}" for line in offending_lines(text)]
    assert not found, "machine paths in the repo:\n" + "\n".join(found)


def test_the_grep_finds_what_it_must():
    assert offending_lines("venv=/work/venv-probe")
    assert offending_lines("cd /home/alice/src")
    assert offending_lines("cat /root/notes.txt")
    assert not offending_lines("ssh key in /root/.ssh/authorized_keys")
    assert not offending_lines("- ${PD_LAB_CACHE:-/root/.cache/pd-lab}/wheelhouse:/opt/pd-lab/wheelhouse:ro")
    assert not offending_lines("render to /tmp/render")
