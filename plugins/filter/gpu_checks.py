"""GPU host checks and the GPUDirect mode, as tested Python (tests/unit/test_gpu_checks.py).

Inputs are the facts of plugins/modules/gpu_facts.py (ansible_facts.gpu) and a host's settings; every refusal
names the host, the variable or fact, its value and the fix. Run by roles/gpu (tasks/preflight.yml) and the rdma
role's preflight, on vllm_platform=cuda hosts only.
"""
import re

# CUDA major -> oldest Linux driver that runs it (minor version compatibility). Source: NVIDIA CUDA Toolkit
# Release Notes, table 3 "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor Version
# Compatibility" (and docs.nvidia.com/deploy/cuda-compatibility: 13.x >= 580, 12.x >= 525, 11.x >= 450).
CUDA_MIN_DRIVER = {
    11: (450, 80, 2),
    12: (525, 60, 13),
    13: (580,),
}
GPUDIRECT_MODES = ('auto', 'peermem', 'dmabuf', 'off')
_TRUE = ('true', 'yes', 'on', '1')
_FALSE = ('false', 'no', 'off', '0', 'none', '')
# nvidia-smi's fabric state once the fabric manager has set up the NVLink fabric (Hopper and later).
FABRIC_DONE = ('Completed',)


def _version(text):
    match = re.match(r'^\s*([0-9]+(?:\.[0-9]+)*)', str(text or ''))
    return tuple(int(p) for p in match.group(1).split('.')) if match else ()


def _vstr(vt):
    return '.'.join('%02d' % p if i else str(p) for i, p in enumerate(vt))


def cuda_major(cfg):
    """The CUDA major the pinned wheels are built for: vLLM >= VLLM_CUDA13_FROM (preflight_checks) is CUDA 13,
    older official vLLM CUDA 12; a mooncake wheel named ...-cudaNN needs NN, the plain one 12. The highest wins."""
    from ansible_collections.pd_bundle.serving.plugins.plugin_utils.preflight import core as checks
    majors = []
    if str(cfg.get('vllm_package', 'vllm')) == 'vllm' and _version(cfg.get('vllm_version')):
        majors.append(13 if _version(cfg.get('vllm_version'))[:2] >= checks.VLLM_CUDA13_FROM else 12)
    pkg = str(cfg.get('mooncake_package', ''))
    match = re.search(r'-cuda([0-9]+)$', pkg)
    if match:
        majors.append(int(match.group(1)))
    elif pkg == checks.PLAIN_WHEEL:
        majors.append(12)
    return max(majors) if majors else None


def gpudirect_mode(value):
    """rdma_gpudirect as a mode: auto/peermem/dmabuf/off; true is peermem and false off (the old boolean).
    None for anything else (preflight refuses it)."""
    if isinstance(value, bool):
        return 'peermem' if value else 'off'
    text = str(value if value is not None else '').strip().lower()
    if text in GPUDIRECT_MODES:
        return text
    if text in _TRUE:
        return 'peermem'
    if text in _FALSE:
        return 'off'
    return None


def _peermem_usable(facts, load_modules):
    pm = (facts or {}).get('peermem') or {}
    return bool(pm.get('loaded')) or (bool(load_modules) and bool(pm.get('loadable')))


def gpudirect_resolve(value, facts, load_modules=True):
    """The mode the engine runs with: auto picks peermem when nvidia_peermem is loaded (or loadable and
    rdma_load_modules), else dmabuf when the kernel and driver support it, else None (gpudirect_errors says why).
    Without facts (render mode) auto stays None; explicit modes pass through."""
    mode = gpudirect_mode(value)
    if mode != 'auto':
        return mode
    if not facts:
        return None
    if _peermem_usable(facts, load_modules):
        return 'peermem'
    if ((facts.get('dmabuf') or {}).get('possible')):
        return 'dmabuf'
    return None


def with_nvidia_peermem(mode, protocol='rdma'):
    """The engine's WITH_NVIDIA_PEERMEM: '1' only for peermem over rdma (the engine defaults to 1, so always set).
    The one place the flag is derived from the mode; an unresolved auto is an error, never a guess."""
    if protocol != 'rdma':
        return '0'
    resolved = gpudirect_mode(mode) if mode is not None else None
    if resolved not in ('peermem', 'dmabuf', 'off'):
        raise ValueError('rdma_gpudirect=%r is not resolved to peermem, dmabuf or off: auto is resolved from the '
                         "host's GPU facts by the rdma role's preflight (playbooks/rdma.yml, in the same run). Fix: run "
                         'site.yml, or set rdma_gpudirect to peermem, dmabuf or off.' % (mode,))
    return '1' if resolved == 'peermem' else '0'


def gpudirect_errors(value, facts, host, load_modules=True):
    """Refusals for rdma_gpudirect on a host whose GPU facts were read."""
    mode = gpudirect_mode(value)
    if mode is None:
        return ['rdma_gpudirect=%r on %s is not a GPUDirect mode. Fix: set rdma_gpudirect to auto, peermem, dmabuf '
                'or off.' % (value, host)]
    if mode == 'off' or facts is None:
        return []
    pm = facts.get('peermem') or {}
    dmabuf = facts.get('dmabuf') or {}
    why_dmabuf = ', '.join(dmabuf.get('reasons') or []) or 'not supported'
    why_peermem = ('not loaded, not in modules.dep of kernel %s' % facts.get('kernel_release')
                   if not pm.get('loadable') else 'not loaded and rdma_load_modules=false')
    if mode == 'peermem' and not _peermem_usable(facts, load_modules):
        return ['rdma_gpudirect=%s on %s, but nvidia_peermem is %s: registering GPU memory would fail with '
                "'Failed to register memory ... Bad address'. Fix: install the driver's nvidia-peermem module (and "
                'rdma_load_modules=true), or set rdma_gpudirect=dmabuf (DMA-BUF: %s) or auto.'
                % (value, host, why_peermem, 'possible' if dmabuf.get('possible') else why_dmabuf)]
    if mode == 'dmabuf' and not dmabuf.get('possible'):
        return ['rdma_gpudirect=dmabuf on %s, but DMA-BUF is not possible (%s). Fix: Linux >= 5.12 with the NVIDIA '
                'open kernel module (driver >= 515), or set rdma_gpudirect=peermem or auto.' % (host, why_dmabuf)]
    if mode == 'auto' and gpudirect_resolve(value, facts, load_modules) is None:
        return ['rdma_gpudirect=auto on %s found no GPUDirect path: nvidia_peermem is %s, and DMA-BUF is not possible '
                '(%s). Fix: install nvidia-peermem, or a kernel >= 5.12 with the NVIDIA open kernel module; or set '
                'rdma_gpudirect=off (KV then moves through host memory).' % (host, why_peermem, why_dmabuf)]
    return []


def gpu_host_errors(facts, cfg, host):
    """Refusals for a cuda host's GPU stack: driver vs CUDA major, GPUs vs inventory, NVSwitch fabric manager,
    persistence mode. cfg: cuda_major inputs, vllm_host_gpu_count (None: not in the inventory), vllm_instances,
    gpu_require_persistence."""
    facts = facts or {}
    out = []
    driver = facts.get('driver_version')
    major = cuda_major(cfg)
    if not driver:
        out.append('%s has no NVIDIA driver loaded (/proc/driver/nvidia/version is missing) with vllm_platform=cuda. '
                   'Fix: install the driver (gpu_driver_install: true, or by hand) and reboot, or set '
                   'vllm_platform=cpu.' % host)
    elif major in CUDA_MIN_DRIVER and _version(driver) < CUDA_MIN_DRIVER[major]:
        out.append('%s runs NVIDIA driver %s, but %s %s / %s are CUDA %d builds, which need driver >= %s. Fix: '
                   'install a driver branch >= %s (gpu_driver_branch), or pin wheels built for an older CUDA.'
                   % (host, driver, cfg.get('vllm_package', 'vllm'), cfg.get('vllm_version'),
                      cfg.get('mooncake_package'), major, _vstr(CUDA_MIN_DRIVER[major]), CUDA_MIN_DRIVER[major][0]))
    gpus = facts.get('gpus') or []
    count = cfg.get('vllm_host_gpu_count')
    if count is not None and str(count).isdigit() and int(count) != len(gpus):
        out.append('vllm_host_gpu_count=%s on %s, but the host has %d NVIDIA GPU(s) (%s). Fix: set '
                   'vllm_host_gpu_count to %d and check each instance\'s gpus, or fix the host (nvidia-smi -L).'
                   % (count, host, len(gpus), ', '.join(g['pci'] for g in gpus) or 'none', len(gpus)))
    for inst in cfg.get('vllm_instances') or []:
        missing = [g for g in (inst.get('gpus') or []) if str(g).isdigit() and int(g) >= len(gpus)]
        if missing:
            out.append('vllm_instances[%s].gpus=%s on %s: GPU index(es) %s do not exist (the host has %d GPUs, '
                       'indexes 0-%d in PCI bus order). Fix: pick indexes the host has.'
                       % (inst.get('name'), inst.get('gpus'), host, missing, len(gpus), len(gpus) - 1))
    smi = facts.get('smi')
    fm = facts.get('fabricmanager') or {}
    if gpus and driver and smi is None:
        out.append('%s: nvidia-smi -q -x gave no output, so persistence mode and the NVLink fabric cannot be checked. '
                   'Fix: install the driver\'s utilities (nvidia-smi) matching driver %s.' % (host, driver))
    if facts.get('nvswitches') and driver:
        bad = [g['pci'] for g in (smi or {}).get('gpus', [])
               if g.get('fabric_state') is not None and g.get('fabric_state') not in FABRIC_DONE]
        if fm.get('active') is False or bad:
            out.append('%s has %d NVSwitch device(s), but the fabric manager is not active (service %s, GPU fabric '
                       'state not Completed on %s): NCCL and TP > 1 hang or fail. Fix: install nvidia-fabricmanager '
                       '%s and systemctl enable --now nvidia-fabricmanager.'
                       % (host, len(facts['nvswitches']), 'inactive' if fm.get('active') is False else 'unknown',
                          ', '.join(bad) or 'none', driver))
        if fm.get('version') and fm.get('version') != driver:
            out.append('%s: nvidia-fabricmanager %s does not match NVIDIA driver %s; the fabric manager refuses to '
                       'start on a mismatch. Fix: install nvidia-fabricmanager %s (same version as the driver) and '
                       'hold both.' % (host, fm['version'], driver, driver))
    off = [g['pci'] for g in (smi or {}).get('gpus', []) if g.get('persistence_mode') == 'Disabled']
    if off and cfg.get('gpu_require_persistence', True) not in (False, 'false', 'False'):
        out.append('%s: persistence mode is off on %s: every vLLM start pays the CUDA init again and GPUs drop to a '
                   'low-power state between runs. Fix: systemctl enable --now nvidia-persistenced (the gpu role does '
                   'with gpu_persistenced: true), or set gpu_require_persistence=false.' % (host, ', '.join(off)))
    return out


def gpu_summary(facts, mode=None):
    """One line for status: driver, CUDA, persistence, fabric manager, GPUDirect mode."""
    facts = facts or {}
    smi = facts.get('smi') or {}
    pers = sorted({g.get('persistence_mode') or '?' for g in smi.get('gpus', [])}) or ['?']
    fm = facts.get('fabricmanager') or {}
    fm_text = 'n/a' if not facts.get('nvswitches') else '%s %s' % (
        {True: 'active', False: 'inactive'}.get(fm.get('active'), '?'), fm.get('version') or '?')
    return 'driver %s, CUDA %s, %d GPU(s), persistence %s, fabric manager %s, GPUDirect %s' % (
        facts.get('driver_version') or 'none', smi.get('cuda_version') or '?', len(facts.get('gpus') or []),
        '/'.join(pers), fm_text, gpudirect_mode(mode) if mode is not None else '?')


class FilterModule(object):
    def filters(self):
        return {
            'gpu_host_errors': gpu_host_errors,
            'gpu_summary': gpu_summary,
            'gpudirect_mode': gpudirect_mode,
            'gpudirect_resolve': gpudirect_resolve,
            'gpudirect_errors': gpudirect_errors,
            'gpu_with_nvidia_peermem': with_nvidia_peermem,
        }
