"""The vLLM role selects its instances' NICs itself: a run limited to it renders the same env files.

Before, the env files read the rdma role's selection behind `| default({})`: `site.yml --tags vllm`
(or playbooks/vllm.yml alone) rendered them without the auto-selected NICs and GID index and would
have rolled every instance onto the engine's defaults. Here inventory/prod with every instance's
`nics: auto`, on the fake sysfs tree of an 8-GPU/8-HCA host (tests/fixtures/sysfs/dgx_8gpu_8ib):
  - the full render and the `--tags vllm` render give byte-identical env files;
  - and both equal inventory/prod's own render, whose NIC lists are spelled out (GPU i sits behind
    the same PCIe switch as mlx5_i, so 'auto' must pick exactly those lists).
"""
import os
import re
import shutil
import subprocess

from conftest import REPO, VAULT_PASS_TEST_ONLY, ansible_bin

SYSFS = REPO / 'tests' / 'fixtures' / 'sysfs' / 'dgx_8gpu_8ib'


def _start(inventory, out, *extra):
    cmd = [ansible_bin('ansible-playbook'), 'playbooks/render.yml', '-i', str(inventory),
           '-e', 'render_dir=%s' % out, '-e', 'rdma_sysfs_root=%s' % SYSFS, *extra]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / 'ansible.cfg'), ANSIBLE_NOCOLOR='1',
               ANSIBLE_VAULT_PASSWORD_FILE=str(VAULT_PASS_TEST_ONLY))
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _env_files(root):
    """The instances' env files (not the key files beside them, api-key.env / hf-token.env)."""
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.glob('*/etc/vllm/*.env'))
            if p.name not in ('api-key.env', 'hf-token.env')}


def test_tags_vllm_renders_the_env_files_of_a_full_run(tmp_path, prod_render):
    inv = tmp_path / 'inventory'
    shutil.copytree(REPO / 'inventory' / 'prod', inv)
    autos = 0
    for hv in (inv / 'host_vars').glob('*.yml'):
        text, n = re.subn(r'nics: \[mlx5[^\]]*\]', 'nics: auto', hv.read_text())
        hv.write_text(text)
        autos += n
    assert autos >= 4, 'inventory/prod changed shape: no explicit nics lists left to turn into auto'

    full, only_vllm = tmp_path / 'full', tmp_path / 'only-vllm'
    procs = [_start(inv, full), _start(inv, only_vllm, '--tags', 'vllm')]  # 2 cores: run side by side
    for p in procs:
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, out[-4000:]

    got_full, got_vllm, want = _env_files(full), _env_files(only_vllm), _env_files(prod_render)
    assert got_full and set(got_full) == set(want)
    assert not (only_vllm / 'gpu-p1' / 'etc' / 'modules-load.d').exists(), '--tags vllm ran the rdma role'
    for path, data in got_full.items():
        assert got_vllm.get(path) == data, '%s differs between the full render and --tags vllm' % path
        assert want[path] == data, '%s: nics=auto did not select the NICs inventory/prod lists' % path
        assert b'MC_TE_FILTERS=mlx5_' in data
