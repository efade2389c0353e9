"""Small filters the bundle's templates share (Jinja alone would repeat these in every role).

- host_ip:            a host's cluster-facing IP from hostvars (common_host_ip > ansible_host > name)
- size_bytes:         '4gb', '512MiB', '1 GB', 1073741824 -> int bytes (Mooncake accepts the same units)
- mooncake_store_cfg: map the seed's older mooncake.json field names onto the current ones
- vllm_tp:            an instance's tensor-parallel size (tensor_parallel_size, else one per GPU, at least 1)
- vllm_side_channel_ports: the MooncakeConnector side-channel ports pinned for a prefill instance
  (side_channel_port, else base + 16 x its index; one port per TP rank). The env file, preflight's
  collision table and the firewall all use this one definition.
- vllm_engine_nics: an instance's NICs and GID index as its engine gets them (the rdma role's
  selection, else the instance's own nics/gid_index). The env file and the transfer check both use it.
- mooncake_check_pairs: every (this prefill instance, decode instance) pair for the transfer check,
  each end as its vLLM instance runs the engine: IP, NICs (device_name / MC_TE_FILTERS) and
  MC_GID_INDEX from the rdma role's selection, else the instance's own nics/gid_index; on vllm_platform
  cuda the memory too (check_memory): GPU memory on the instance's first GPU, with its WITH_NVIDIA_PEERMEM.
- mooncake_check_argv: the check's command line for one end (serve or probe), the one place it is built.
- vllm_endpoints:     every vLLM instance of a list of hosts as the fleet reaches it (host, name, ip, port,
  url, bootstrap_port, engine_id): the router's worker lists, preflight's address and router checks and
  the benchmark all read this one definition.
- BUNDLE_GROUPS / host_roles: the inventory groups the bundle knows, and which of its roles a host runs
  (the firewall, preflight, the monitoring targets and the infra tests read this one mapping).
- host_listeners:     every TCP port a host's bundle services bind (port or range, the variable that sets
  it, why, and its sources: the named source classes allowed to connect): preflight's collision check and the
  firewall's rules both read it.
- firewall_source_classes: the addresses of each source class (SOURCE_CLASSES) of an inventory.
- firewall_plan:      one host's ruleset (public ports, protected ports, each class's addresses and ports)
  from its host_listeners and the source classes: what the firewall's template writes.
- vllm_stale_instances: instances whose process started before one of their inputs last changed
  (a run that changed a file but failed before the restart must not lose that restart).
- router_argv:        vllm-router's command line from the router role's settings and its worker lists.
- master_ha:          whether the Mooncake masters elect a leader through etcd (mooncake_master_ha:
  auto = 2+ masters). The master's flags, the clients' master address and preflight all use it.
- metadata_backend:   where store-mode engines keep their segment metadata (mooncake_metadata_backend:
  auto = etcd when the masters are HA, else the first master's HTTP metadata server).
- etcd_mooncake_hostports: host:port of every etcd member for Mooncake's etcd client, each member's own
  client port, or its plain listener (etcd_mooncake_client_port) when that member runs TLS.
- host_cfg:           a host's effective settings of EVERY role: the roles' literal defaults
  (roles/*/defaults/main.yml) overlaid by the inventory. Plays and roles that read another role's
  variable (status, the firewall, the mooncake role's view of the masters) read it here, so no
  literal copy of another role's default exists anywhere.
"""
import os
import re

from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # unit tests run without ansible
    class AnsibleFilterError(Exception):
        pass

# Reading another host's variables (hostvars[host]) makes Ansible compute all of that host's variables again
# (VariableManager.get_vars, its facts copied and cleaned): a firewall ruleset, which reads every host of the
# inventory, did that hundreds of times per task and was a fifth of a no-change re-run's controller CPU. Inside one
# of Ansible's worker processes (forked for one task on one host, exiting after it) no host's variables change,
# so each is read once there (_hv). The controller process, where variables change between tasks, and any process
# that imported this file itself (unit tests, a run without the speedups callback) read them every time.
_IMPORT_PID = os.getpid()
_WORKER_CACHE = {}


def _worker_cached(kind, key, make):
    """make(), once per (kind, key) in this worker process (never in the process that imported this file)."""
    pid = os.getpid()
    if pid == _IMPORT_PID:
        return make()
    cache = _WORKER_CACHE.get(pid)
    if cache is None:
        _WORKER_CACHE.clear()  # a fork inherits its parent's entries: not its own
        cache = _WORKER_CACHE[pid] = {}
    if (kind, key) not in cache:
        cache[(kind, key)] = make()
    return cache[(kind, key)]


def _hv(hostvars, host):
    """hostvars[host], read once per worker process (see _worker_cached)."""
    return _worker_cached('hv', (id(hostvars), str(host)), lambda: hostvars[host])


_UNITS = {'': 1, 'b': 1, 'k': 1024, 'kb': 1024, 'kib': 1024, 'm': 1024 ** 2, 'mb': 1024 ** 2,
          'mib': 1024 ** 2, 'g': 1024 ** 3, 'gb': 1024 ** 3, 'gib': 1024 ** 3, 't': 1024 ** 4,
          'tb': 1024 ** 4, 'tib': 1024 ** 4}
_SIZE_RE = re.compile(r'^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$')

# Seed (older vLLM docs) name -> current Mooncake name. The seed's pools were the
# store's contributed segment (cpu) and the local transfer buffer (gpu).
LEGACY_STORE_FIELDS = {
    'cpu_memory_pool_size': 'global_segment_size',
    'gpu_memory_pool_size': 'local_buffer_size',
}


def size_bytes(value, name='size'):
    """Parse a memory size; binary units, as Mooncake's own parser uses."""
    if isinstance(value, bool):
        raise AnsibleFilterError('%s=%r is not a size: use an integer of bytes or e.g. "4gb"' % (name, value))
    if isinstance(value, int):
        if value <= 0:
            raise AnsibleFilterError('%s=%r must be positive' % (name, value))
        return value
    m = _SIZE_RE.match(str(value))
    if not m or m.group(2).lower() not in _UNITS:
        raise AnsibleFilterError(
            '%s=%r is not a size: use an integer of bytes or a number with a unit (b, kb, mb, gb, tb, or KiB..TiB)'
            % (name, value))
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n <= 0:
        raise AnsibleFilterError('%s=%r must be positive' % (name, value))
    return n


def is_size(value):
    try:
        size_bytes(value)
        return True
    except AnsibleFilterError:
        return False


def mooncake_store_cfg(cfg):
    """Return cfg with legacy keys renamed; a key given under both names is an error."""
    out = {}
    for key, val in dict(cfg or {}).items():
        new = LEGACY_STORE_FIELDS.get(key, key)
        if new in out:
            raise AnsibleFilterError('mooncake store config sets both %s and its older name' % new)
        out[new] = val
    return out


def host_ip(host, hostvars):
    hv = _hv(hostvars, host)
    for key in ('common_host_ip', 'ansible_host'):
        if hv.get(key):
            return str(hv[key])
    return str(host)


def router_api_key(router_hosts, hostvars):
    """The routers' worker key (vllm_router_api_key; preflight makes every router's the same), '' when none:
    the vLLM instances demand it, and the entry sends it on with the requests it forwards."""
    for h in router_hosts or []:
        key = str(_hv(hostvars, h).get('vllm_router_api_key') or '')
        if key:
            return key
    return ''


def router_bind(host, hostvars):
    """The address vllm-router listens on: vllm_router_host, or, when it is empty (the default), the host's
    cluster address (bundle_host_ip): the routers take the entry hosts, never the world."""
    return str(host_cfg(host, hostvars).get('vllm_router_host') or host_ip(host, hostvars))


def router_local_url(host, hostvars):
    """http://ADDR:PORT of the router as seen on its own host (127.0.0.1 when it binds every address):
    the router role's health wait, status and router-overhead read this one definition."""
    return _local_url(router_bind(host, hostvars), host_cfg(host, hostvars)['vllm_router_port'])


def _local_url(addr, port):
    addr = '127.0.0.1' if addr in ('0.0.0.0', '::', '*') else addr
    return 'http://%s:%s' % ('[%s]' % addr if ':' in addr else addr, port)


def master_local_url(host, hostvars):
    """http://ADDR:PORT of a Mooncake master's metrics server (/health, /metrics) as seen on its own host:
    mooncake_master_metrics_host (the cluster address by default). The master's health waits, its watchdog
    unit and status read this one definition."""
    cfg = host_cfg(host, hostvars)
    addr = str(cfg.get('mooncake_master_metrics_host') or host_ip(host, hostvars))
    return _local_url(addr, cfg['mooncake_master_metrics_port'])


def router_endpoints(router_hosts, hostvars):
    """Every router as the other roles reach it: address, port and url from another host (its bind address,
    or its cluster address when it binds every address), local_url on its own host (router_local_url), and the
    header its key asks for ({} without one), and its implementation (vllm-router or smg: which worker API it has).
    The entry's backends and the vLLM drain read this list."""
    out = []
    for h in router_hosts or []:
        bind = router_bind(h, hostvars)
        key = str(_hv(hostvars, h).get('vllm_router_api_key') or '')
        addr = host_ip(h, hostvars) if bind in ('0.0.0.0', '::', '*') else bind
        port = int(host_cfg(h, hostvars)['vllm_router_port'])
        out.append({'host': h, 'address': addr, 'port': port,
                    'url': 'http://%s:%s' % ('[%s]' % addr if ':' in addr else addr, port),
                    'local_url': router_local_url(h, hostvars),
                    'headers': {'Authorization': 'Bearer ' + key} if key else {},
                    'implementation': str(host_cfg(h, hostvars)['vllm_router_implementation'])})
    return out


SIDE_CHANNEL_STRIDE = 16  # ports reserved per instance by the base formula (the largest TP per host)
# The lowest port the side-channel pin binds (plugins/tools/pd_bundle_side_channel.py: the units run unprivileged).
SIDE_CHANNEL_MIN_PORT = 1024


def vllm_tp(inst):
    inst = inst or {}
    if inst.get('tensor_parallel_size') is not None:
        return int(inst['tensor_parallel_size'])
    return max(len(inst.get('gpus') or []), 1)


def vllm_side_channel_ports(inst, instances, base):
    """Ports [first, first + TP) for inst, the instance at its position in instances."""
    if inst.get('side_channel_port') is not None:
        first = int(inst['side_channel_port'])
    else:
        names = [i.get('name') for i in instances]
        first = int(base) + SIDE_CHANNEL_STRIDE * names.index(inst.get('name'))
    return list(range(first, first + vllm_tp(inst)))


def vllm_engine_nics(inst, selection):
    """{'nics': [...], 'gid_index': int or None} of a vLLM instance: the rdma role's selection for it
    (rdma_instance_selection) first, else the instance's own nics / gid_index. An unresolved 'auto'
    (a string) is no NIC list."""
    sel = (selection or {}).get(inst.get('name')) or {}
    nics = sel['nics'] if 'nics' in sel else inst.get('nics')
    gid = sel['gid_index'] if 'gid_index' in sel else inst.get('gid_index')
    return {'nics': [] if not nics or isinstance(nics, str) else list(nics), 'gid_index': gid}


CHECK_MEMORY = ('auto', 'host', 'cuda')


def check_memory(setting, platform, inst):
    """'cuda' or 'host': the memory a check end moves (mooncake_check_memory). auto: GPU memory where the
    instance keeps its KV there (vllm_platform cuda and the instance lists GPUs), else host memory (the CPU
    lab; GPU-less VMs of the RDMA lab)."""
    setting = str(setting if setting is not None else 'auto').strip().lower()
    if setting not in CHECK_MEMORY:
        raise AnsibleFilterError('mooncake_check_memory=%r is not one of %s' % (setting, ', '.join(CHECK_MEMORY)))
    if setting != 'auto':
        return setting
    return 'cuda' if platform == 'cuda' and (inst or {}).get('gpus') else 'host'


def _check_with_nvidia_peermem(host, hv, cfg, protocol):
    """WITH_NVIDIA_PEERMEM of a GPU-memory check end, as the instance's env file gets it (roles/vllm/vars): the
    rdma role's resolved mode of this run, else the setting; auto is decided from this run's GPU facts."""
    from ansible_collections.pd_bundle.serving.plugins.filter import gpu_checks as gpu  # imports the preflight package
    mode = hv.get('rdma_gpudirect_mode') or cfg.get('vllm_gpudirect_rdma') or cfg.get('rdma_gpudirect')
    facts = (hv.get('ansible_facts') or {}).get('gpu')
    resolved = gpu.gpudirect_resolve(mode, facts, _boollike(cfg.get('rdma_load_modules', True)))
    try:
        return gpu.with_nvidia_peermem(resolved or mode, protocol)
    except ValueError as e:
        raise AnsibleFilterError('transfer check on %s: %s' % (host, e))


def _check_end(host, inst, hostvars, protocol):
    """One end of a transfer check, as templates/vllm/instance.env.j2 configures that instance."""
    hv = _hv(hostvars, host)
    cfg = host_cfg(host, hostvars)
    nics, gid = [], None
    if protocol == 'rdma':  # over tcp the instance gets MC_FORCE_TCP and neither of these
        eng = vllm_engine_nics(inst, hv.get('rdma_instance_selection'))
        # No NIC list (no selection, 'auto' unresolved): the host's check device.
        nics = eng['nics'] or [d for d in str(hv.get('mooncake_check_device') or '').split(',') if d]
        gid = eng['gid_index']
    env = {}
    if nics:
        env['MC_TE_FILTERS'] = ','.join(nics)
    if gid is not None:
        env['MC_GID_INDEX'] = str(gid)
    memory = check_memory(cfg.get('mooncake_check_memory'), cfg.get('vllm_platform'), inst)
    gpu, python = None, None
    if memory == 'cuda':
        # Rank 0's GPU, numbered as the instance's CUDA_VISIBLE_DEVICES numbers it; torch and a CUDA wheel
        # are in the vLLM venv (the mooncake venv has neither).
        gpu = int((inst.get('gpus') or [0])[0])
        python = '%s/bin/python' % cfg.get('vllm_venv')
        env['WITH_NVIDIA_PEERMEM'] = _check_with_nvidia_peermem(host, hv, cfg, protocol)
    return {'host': host, 'instance': inst.get('name'), 'ip': str(inst.get('host_ip') or host_ip(host, hostvars)),
            'device': ','.join(nics), 'gid_index': gid, 'env': env, 'memory': memory, 'gpu': gpu, 'python': python}


def mooncake_check_pairs(decode_hosts, prefill_host, hostvars, protocol, pools=None):
    """[{source, target}] for every instance of prefill_host x every instance of decode_hosts; with POOLS (the
    normalized model pools, plugins/filter/pools.py) only the pairs of one pool: KV never moves between pools, and
    the firewall opens a host's KV ports to its own pools' hosts only (firewall_source_classes)."""
    def instances(host):
        return _hv(hostvars, host).get('vllm_instances') or [{'name': None}]

    def same_pool(p, d, i):
        return pools is None or _pools.bundle_pool_of(pools, prefill_host, p.get('name')) == \
            _pools.bundle_pool_of(pools, d, i.get('name'))
    return [{'source': _check_end(prefill_host, p, hostvars, protocol), 'target': _check_end(d, i, hostvars, protocol)}
            for p in instances(prefill_host) for d in decode_hosts for i in instances(d) if same_pool(p, d, i)]


def run_as_argv(user, unlimited_memlock=False):
    """The prefix that runs a command as user instead of root (Ansible runs it as root): with unlimited_memlock
    (RDMA registers the buffer; only root may raise the limit, and an unprivileged process has no CAP_IPC_LOCK
    to ignore it) prlimit first, then setpriv drops to the user, its group and supplementary groups (no PAM
    session, so the environment Ansible passes stays). [] when user is empty."""
    if not user:
        return []
    return (['prlimit', '--memlock=unlimited', '--'] if unlimited_memlock else []) + [
        'setpriv', '--reuid=%s' % user, '--regid=%s' % user, '--init-groups', '--']


def mooncake_check_argv(end, action, opts):
    """The check's command line for one end (an item of mooncake_check_pairs): action 'serve' (the target) or
    'probe' (the initiator, writing to opts['target']). opts: tool, protocol, size, port, and for probe target,
    duration, min_ratio; run_as (optional): the unprivileged user it runs as (run_as_argv, locked memory
    unlimited with protocol rdma). A GPU-memory end runs the tool with its python and adds --memory/--gpu."""
    argv = (run_as_argv(opts.get('run_as'), opts['protocol'] == 'rdma') + ([end['python']] if end.get('python') else [])
            + [opts['tool'], action])
    common = ['--host-ip=%s' % end['ip'], '--protocol=%s' % opts['protocol'], '--device=%s' % end['device']]
    if action == 'serve':
        argv += common + ['--size=%s' % opts['size'], '--control-port=%s' % opts['port'], '--timeout=300']
    elif action == 'probe':
        argv += ['--json'] + common + ['--target=%s' % opts['target'], '--control-port=%s' % opts['port'],
                                       '--size=%s' % opts['size'], '--duration=%s' % opts['duration'],
                                       '--min-ratio=%s' % opts['min_ratio']]
    else:
        raise AnsibleFilterError('mooncake_check_argv: action %r is not serve or probe' % (action,))
    if end.get('memory') == 'cuda':
        argv += ['--memory=cuda', '--gpu=%d' % end['gpu']]
    return argv


def vllm_endpoints(hosts, hostvars, settings_key=None, default_bootstrap_port=None):
    """[{host, name, ip, port, url, bootstrap_port, engine_id}] for every instance of `hosts`, in order.

    An instance's ip is its host_ip, else its host's (host_ip filter); bootstrap_port its own, else the
    host's vllm_default_bootstrap_port, else default_bootstrap_port, else the vllm role's default
    (role_defaults: never a copy of it). settings_key reads each host's
    vllm_instances and vllm_default_bootstrap_port from hostvars[host][settings_key] (preflight's effective
    settings) instead of hostvars[host]."""
    out = []
    for h in hosts or []:
        hv = _hv(hostvars, h)
        cfg = (hv.get(settings_key) or {}) if settings_key else hv
        dflt = cfg.get('vllm_default_bootstrap_port', default_bootstrap_port)
        if dflt is None:
            dflt = role_defaults()[1].get('vllm_default_bootstrap_port')
        for i in cfg.get('vllm_instances') or []:
            ip = str(i.get('host_ip') or host_ip(h, hostvars))
            out.append({'host': h, 'name': i.get('name'), 'ip': ip, 'port': i.get('port'),
                        'url': 'http://%s:%s' % (ip, i.get('port')),
                        'bootstrap_port': i.get('bootstrap_port', dflt),
                        'engine_id': i.get('engine_id') or '%s-%s' % (h, i.get('name'))})
    return out


def _truthy(value, default):
    """A boolean setting, leniently (preflight refuses the malformed ones before anything runs)."""
    if value is None or value == '':
        return default
    return value if isinstance(value, bool) else str(value).strip().lower() in ('true', 'yes', 'on', '1')


# Who may connect to a listener (host_listeners' sources). Each class is a set of addresses the firewall
# builds from the inventory (firewall_source_classes); a listener with no class is reachable over loopback only.
SOURCE_CLASSES = {
    'any': 'everyone (a public port)',
    'etcd': 'the etcd members',
    'master': 'the Mooncake masters',
    'prefill': 'the prefill hosts (and their instances\' host_ip)',
    'decode': 'the decode hosts (and their instances\' host_ip)',
    'router': 'the vllm-router hosts',
    'entry': 'the entry hosts (HAProxy)',
    'store_clients': 'the prefill/decode hosts that run a Mooncake store client: all of them in store mode '
                     '(MooncakeStoreConnector), else the store tier\'s prefill hosts (vllm_store_tier) and the '
                     'two hosts of verify.yml\'s store round trip',
    'monitoring': 'the monitoring group\'s hosts (Prometheus) and firewall_extra_sources (your own Prometheus, Grafana)',
    # Never a bundle listener's: firewall_cluster_tcp_ports (the operator's services for the fleet).
    'cluster': 'every bundle host',
}
STORE_CONNECTOR = 'MooncakeStoreConnector'
# The store tier's SSD client unit on bundle_store_ssd_hosts (the vllm role's _vllm_store_ssd_unit; monitoring and
# status read it here, a unit test checks the role agrees).
STORE_SSD_UNIT = 'mooncake-store-client'

# The inventory groups of the bundle, each with the role key host_roles gives its hosts.
# vllm_spare (issue 32): hosts with vLLM and Mooncake installed that serve nothing until the inventory moves them
# into vllm_prefill or vllm_decode (a scale-out then only starts the instance).
BUNDLE_GROUPS = {'etcd': 'etcd', 'mooncake_master': 'master', 'vllm_prefill': 'prefill', 'vllm_decode': 'decode',
                 'vllm_spare': 'spare', 'vllm_router': 'router', 'entry': 'entry', 'monitoring': 'monitoring'}


def bundle_hosts(groups):
    """Every host of the bundle's groups, once, in group order (the firewall's 'cluster', the node exporters)."""
    out = []
    for g in BUNDLE_GROUPS:
        out += [h for h in (groups or {}).get(g) or [] if h not in out]
    return out


def host_roles(host, groups):
    """Which of the bundle's roles host runs, from the inventory groups: one key per BUNDLE_GROUPS role, and
    vllm (prefill or decode), engine (vllm or master), behind_entry (the inventory has an entry group: the
    routers' client port is for the entry hosts only), node_exporter (the inventory has a monitoring group and
    host is a bundle host: it runs prometheus-node-exporter)."""
    groups = groups or {}
    r = {role: host in (groups.get(g) or []) for g, role in BUNDLE_GROUPS.items()}
    r['vllm'] = r['prefill'] or r['decode']
    r['engine'] = r['vllm'] or r['master']
    r['behind_entry'] = bool(groups.get('entry'))
    r['node_exporter'] = bool(groups.get('monitoring')) and any(r[role] for role in BUNDLE_GROUPS.values())
    return r


# Distro packages of the bundle's roles whose lists are not a setting (etcd_packages and mooncake_system_packages
# are), by the host_roles key that runs them. The roles' install tasks read them here (bundle_role_packages), and
# playbooks/packages.yml installs a host's whole set in one apt transaction (bundle_host_packages).
ROLE_PACKAGES = {
    'firewall': ['nftables'],
    'node_exporter': ['prometheus-node-exporter'],
    'monitoring': ['prometheus', 'prometheus-alertmanager'],
    'vllm': ['python3-venv', 'python3-packaging', 'libnuma1', 'libibverbs1', 'libcurl4', 'libgomp1'],
    'router': ['python3-venv', 'python3-packaging'],
    'entry': ['haproxy', 'curl'],
}


def role_packages(role, host, groups, hostvars):
    """The distro packages role installs on host: ROLE_PACKAGES, keepalived on entry hosts when there are 2+,
    etcd_packages (etcd_install_method package) and mooncake_system_packages (the mooncake role, on every vLLM and
    master host) from host's settings."""
    if role == 'etcd':
        cfg = host_cfg(host, hostvars)
        return list(cfg.get('etcd_packages') or []) if cfg.get('etcd_install_method') == 'package' else []
    if role == 'mooncake':
        return list(host_cfg(host, hostvars).get('mooncake_system_packages') or [])
    if role not in ROLE_PACKAGES:
        raise AnsibleFilterError('bundle_role_packages: no role %r (one of %s, etcd, mooncake)'
                                 % (role, ', '.join(ROLE_PACKAGES)))
    extra = ['keepalived'] if role == 'entry' and len((groups or {}).get('entry') or []) > 1 else []
    return list(ROLE_PACKAGES[role]) + extra


def host_packages(host, groups, hostvars):
    """Every distro package the bundle's roles install on host (bundle_role_packages of each role it runs, the
    firewall where firewall_enabled), once each, in role order: playbooks/packages.yml's one apt transaction."""
    roles = host_roles(host, groups)
    runs = {'firewall': _truthy(host_cfg(host, hostvars).get('firewall_enabled'), False) and host in bundle_hosts(groups),
            'node_exporter': roles['node_exporter'], 'etcd': roles['etcd'], 'mooncake': roles['engine'] or roles['spare'],
            'vllm': roles['vllm'] or roles['spare'], 'router': roles['router'], 'entry': roles['entry'], 'monitoring': roles['monitoring']}
    out = []
    for role, on in runs.items():
        if on:
            out += [p for p in role_packages(role, host, groups, hostvars) if p not in out]
    return out


def host_listeners(cfg, roles):
    """The TCP listeners of one host, from its effective settings cfg and roles (host_roles; the firewall adds
    http_metadata: master_http_metadata). Each: {port, last (a range's end, else None), spec ('8100' or
    '18100-18103', as nft writes it), vars (one label per port: the variable that sets it), why,
    sources (the SOURCE_CLASSES allowed to connect; [] = loopback only, ['any'] = everyone),
    public (sources == ['any']), entry_only (sources == ['entry']), engine_range (the transfer engine's
    random-port range)}.
    In the firewall's rule order: etcd, master, engine range and check port, vLLM instances,
    side channels, router, entry, monitoring, node exporter."""
    out = []

    def add(port, labels, why, sources, last=None, engine_range=False):
        unknown = [s for s in sources if s not in SOURCE_CLASSES]
        if unknown:  # a typo here would silently open or close a port
            raise AnsibleFilterError('host_listeners: %s has unknown source classes %s' % (labels[0], unknown))
        spec = '%s-%s' % (port, last) if last is not None else str(port)
        out.append({'port': port, 'last': last, 'spec': spec, 'vars': labels, 'why': why, 'sources': list(sources),
                    'public': list(sources) == ['any'], 'engine_range': engine_range,
                    'entry_only': list(sources) == ['entry']})

    # Peers that move KV: the transfer engine, its check, the P2P handshake and the side channels.
    kv_peers = ['prefill', 'decode']
    vllm = bool(roles.get('prefill')) or bool(roles.get('decode'))
    if roles.get('etcd'):
        tls = _truthy(cfg.get('etcd_tls_enabled'), False)
        # With TLS only members hold the client certificate; without it Mooncake's clients use this port too.
        add(cfg.get('etcd_client_port'), ['etcd_client_port'], 'etcd client', ['etcd'] if tls else ['etcd', 'master', 'store_clients'])
        add(cfg.get('etcd_peer_port'), ['etcd_peer_port'], 'etcd peer', ['etcd'])
        # /metrics and /health apart from the API (ETCD_LISTEN_METRICS_URLS, TLS like the client port).
        add(cfg.get('etcd_metrics_port'), ['etcd_metrics_port'], 'etcd metrics/health', ['monitoring'])
        plain = cfg.get('etcd_mooncake_client_port')
        if tls and plain is not None and str(plain) != '':
            add(plain, ['etcd_mooncake_client_port'], 'etcd plain client listener for Mooncake', ['master', 'store_clients'])
    if roles.get('master'):
        add(cfg.get('mooncake_master_rpc_port'), ['mooncake_master_rpc_port'], 'Mooncake master RPC', ['store_clients'])
        # /metrics and /health; scraped by monitoring, every bundle check reads its own master's over loopback.
        add(cfg.get('mooncake_master_metrics_port'), ['mooncake_master_metrics_port'], 'Mooncake master metrics/health',
            ['monitoring'])
        # roles['http_metadata']: master_http_metadata (the firewall); without it, on unless turned off.
        if roles.get('http_metadata', str(cfg.get('mooncake_master_http_metadata_server')).lower() not in ('false', 'no', 'off', '0')):
            add(cfg.get('mooncake_master_http_metadata_port'), ['mooncake_master_http_metadata_port'],
                'Mooncake master HTTP metadata', ['store_clients'])
    if roles.get('master') or vllm:
        add(cfg.get('mooncake_rpc_port_min'), ['mooncake_rpc_port_min..mooncake_rpc_port_max'],
            'transfer engine RPC/data range', kv_peers, last=cfg.get('mooncake_rpc_port_max'), engine_range=True)
        add(cfg.get('mooncake_check_port'), ['mooncake_check_port'], 'mooncake-check control', kv_peers)
    if roles.get('store_ssd'):
        # The host's mooncake-store-client (vllm_store_ssd): /health and /metrics; its disk reads for the other store
        # clients on a kernel-picked port (no option pins it: vllm_store_ssd_offload_rpc_port_min..max); its service
        # port for local callers only. Its transfer engine uses the engine range above.
        add(cfg.get('vllm_store_ssd_http_port'), ['vllm_store_ssd_http_port'], 'Mooncake store client health/metrics',
            ['monitoring'])
        add(cfg.get('vllm_store_ssd_service_port'), ['vllm_store_ssd_service_port'], 'Mooncake store client service (local)', [])
        add(cfg.get('vllm_store_ssd_offload_rpc_port_min'),
            ['vllm_store_ssd_offload_rpc_port_min..vllm_store_ssd_offload_rpc_port_max'],
            'Mooncake store client disk reads (kernel-picked port)', ['store_clients'],
            last=cfg.get('vllm_store_ssd_offload_rpc_port_max'), engine_range=True)
    instances = cfg.get('vllm_instances') or [] if vllm else []
    for i in instances:
        name = i.get('name')
        # The API takes the routers' key; /metrics shares the port (vLLM serves it without a key).
        add(i.get('port'), ['vllm_instances[%s].port' % name], 'vLLM %s HTTP (API, /metrics)' % name, ['router', 'monitoring'])
        if roles.get('prefill'):
            own = i.get('bootstrap_port') is not None
            add(i.get('bootstrap_port') if own else cfg.get('vllm_default_bootstrap_port'),
                ['vllm_instances[%s].bootstrap_port%s' % (name, '' if own else ' (vllm_default_bootstrap_port)')],
                # The routers too: vllm-router (--kv-connector mooncake) queries each prefill's bootstrap server
                # when it starts ("Querying Mooncake bootstrap at http://...:8998"); refused, it never serves.
                'vLLM %s Mooncake bootstrap' % name, kv_peers + ['router'])
    if roles.get('prefill'):
        for i in instances:
            name, own = i.get('name'), i.get('side_channel_port') is not None
            sc = vllm_side_channel_ports(i, instances, cfg.get('vllm_side_channel_port_base'))
            labels = ['vllm_instances[%s].side_channel_port%s%s' % (name, ' + %d' % n if n else '',
                                                                    '' if own else ' (vllm_side_channel_port_base)')
                      for n in range(len(sc))]
            add(sc[0], labels, 'vLLM %s MooncakeConnector side channel (pinned)' % name, kv_peers,
                last=sc[-1] if len(sc) > 1 else None)
    if roles.get('router'):
        behind = bool(roles.get('behind_entry'))
        add(cfg.get('vllm_router_port'), ['vllm_router_port'],
            'vllm-router clients (the entry hosts)' if behind else 'vllm-router clients', ['entry'] if behind else ['any'])
        add(cfg.get('vllm_router_prometheus_port'), ['vllm_router_prometheus_port'], 'vllm-router Prometheus', ['monitoring'])
    if roles.get('entry'):
        add(cfg.get('entry_port'), ['entry_port'], 'entry HTTPS (HAProxy)', ['any'])
        add(cfg.get('entry_check_port'), ['entry_check_port'], 'entry local health (HAProxy, loopback)', [])
    if roles.get('monitoring'):
        # The other monitoring hosts and firewall_extra_sources (your Grafana, your browser's network).
        add(cfg.get('monitoring_prometheus_port'), ['monitoring_prometheus_port'], 'Prometheus (UI, API)', ['monitoring'])
        add(cfg.get('monitoring_alertmanager_port'), ['monitoring_alertmanager_port'], 'Alertmanager', ['monitoring'])
    if roles.get('node_exporter'):
        add(cfg.get('monitoring_node_exporter_port'), ['monitoring_node_exporter_port'], 'node exporter', ['monitoring'])
    return out


def _host_addresses(host, hostvars):
    """A host's cluster IP and every instance's own host_ip: the addresses its connections come from."""
    out = [host_ip(host, hostvars)]
    out += [str(i['host_ip']) for i in _hv(hostvars, host).get('vllm_instances') or [] if i.get('host_ip')]
    return out


def store_mode(groups, hostvars):
    """Whether the vLLM hosts run MooncakeStoreConnector (preflight makes every host's connector the same)."""
    return any(host_cfg(h, hostvars).get('vllm_kv_connector') == STORE_CONNECTOR
               for h in list(groups.get('vllm_prefill') or []) + list(groups.get('vllm_decode') or []))


def store_tier_hosts(groups, hostvars):
    """The prefill hosts whose instances run the store as a reuse tier behind P2P (vllm_store_tier, P2P mode,
    with a master to store through): their store clients talk to each other and to the masters."""
    if store_mode(groups, hostvars) or not groups.get('mooncake_master'):
        return []
    return [h for h in groups.get('vllm_prefill') or [] if _boollike(host_cfg(h, hostvars).get('vllm_store_tier', False))]


def store_ssd_hosts(groups, hostvars):
    """The store tier's hosts that run a mooncake-store-client unit with an SSD tier (vllm_store_ssd): the masters
    turn offload on for them (mooncake_master_offload auto), the firewall opens their client's ports, monitoring
    scrapes it."""
    return [h for h in store_tier_hosts(groups, hostvars) if _boollike(host_cfg(h, hostvars).get('vllm_store_ssd', False))]


def firewall_source_classes(groups, hostvars, extra_sources=None, pools=None, host=None):
    """{class: [address or network, ...]} for every SOURCE_CLASSES entry but 'any', plus 'cluster' (every
    bundle host, for firewall_cluster_tcp_ports). store_clients: every prefill/decode host in store mode; in
    P2P mode the hosts of verify.yml's store round trip (the first prefill puts, the first decode gets:
    roles/mooncake/tasks/check_store.yml), which it runs whenever there is a master.
    With POOLS (the normalized model pools) and HOST, a host that serves in a pool gets as prefill and decode only
    the hosts of its own pools: its KV ports (engine range, check port, bootstrap, side channels) take no
    connection from another pool's instances. The implicit pool of an inventory without vllm_pools holds every
    vLLM host, so nothing changes there; a host in no pool (a master) keeps every prefill and decode host."""
    def ips(hosts):
        seen = []
        for h in hosts:
            for a in _host_addresses(h, hostvars):
                if a not in seen:
                    seen.append(a)
        return seen

    g = {k: list(groups.get(k) or []) for k in BUNDLE_GROUPS}
    cluster = ips(bundle_hosts(g))
    if store_mode(groups, hostvars):
        store = g['vllm_prefill'] + g['vllm_decode']
    elif g['mooncake_master']:
        tier = store_tier_hosts(groups, hostvars)
        store = [h for h in g['vllm_prefill'] if h in tier or h in g['vllm_prefill'][:1]] + g['vllm_decode'][:1]
    else:
        store = []
    mine = [p for p in pools or [] if str(host) in _pools.pool_hosts(p)]
    if mine:
        peers = {h for p in mine for h in _pools.pool_hosts(p)}
        g['vllm_prefill'] = [h for h in g['vllm_prefill'] if str(h) in peers]
        g['vllm_decode'] = [h for h in g['vllm_decode'] if str(h) in peers]
    monitoring = ips(g['monitoring'])
    classes = {'etcd': ips(g['etcd']), 'master': ips(g['mooncake_master']), 'prefill': ips(g['vllm_prefill']),
               'decode': ips(g['vllm_decode']), 'router': ips(g['vllm_router']), 'entry': ips(g['entry']),
               'store_clients': ips(store),
               'monitoring': monitoring + [str(s) for s in extra_sources or [] if str(s) not in monitoring]}
    classes['cluster'] = cluster
    return classes


def firewall_plan(listeners, classes, cluster_ports=None):
    """What templates/firewall/pd-bundle.nft.j2 writes for one host, from its host_listeners and the
    inventory's firewall_source_classes: {public: [spec] (sources 'any'), protected: [{spec, why, sources}]
    (every other port, firewall_cluster_tcp_ports as class 'cluster'; accepted from its classes, refused from
    everyone else), classes: [{name, v4, v6, ports}] (each class a protected port names, SOURCE_CLASSES order:
    its addresses and the ports they may reach)}. A listener with no class is reachable over loopback only."""
    public = [e['spec'] for e in listeners or [] if 'any' in e['sources']]
    protected = [{'spec': e['spec'], 'why': e['why'], 'sources': list(e['sources'])}
                 for e in listeners or [] if 'any' not in e['sources']]
    protected += [{'spec': str(p), 'why': 'firewall_cluster_tcp_ports (not a bundle service)', 'sources': ['cluster']}
                  for p in cluster_ports or []]
    plan = []
    for name in SOURCE_CLASSES:
        ports = [p['spec'] for p in protected if name in p['sources']]
        if name == 'any' or not ports:
            continue
        addrs = [str(a) for a in classes.get(name) or []]
        plan.append({'name': name, 'ports': ports, 'v4': [a for a in addrs if ':' not in a],
                     'v6': [a for a in addrs if ':' in a]})
    return {'public': public, 'protected': protected, 'classes': plan}


def listener_port_table(listeners):
    """[[port, variable]] per fixed port (ranges of pinned ports expanded), for preflight's collision check."""
    table = []
    for e in listeners or []:
        if e['engine_range']:
            continue
        if e['last'] is None:
            table.append([e['port'], e['vars'][0]])
        else:
            table.extend([int(e['port']) + n, label] for n, label in enumerate(e['vars']))
    return table


def _vllm_units_shown(show_stdout):
    """[(instance name, {property: value})] of the vllm@ units in one `systemctl show` output (a block per unit,
    blank-line separated): the one parser of vllm_stale_instances and vllm_unloaded_instances."""
    out = []
    for block in str(show_stdout or '').split('\n\n'):
        props = dict(line.split('=', 1) for line in block.splitlines() if '=' in line)
        unit = props.get('Id', '')
        if unit.startswith('vllm@'):
            out.append((unit[len('vllm@'):].removesuffix('.service'), props))
    return out


def vllm_stale_instances(show_stdout, stat_stdout, inputs):
    """[instance name] whose main process started before one of its inputs' mtime.

    show_stdout: one `systemctl show --timestamp=unix --property=Id,ExecMainStartTimestamp vllm@A vllm@B`
    (a block per unit, blank-line separated; the timestamp '@<epoch>', empty when not running).
    stat_stdout: one `stat --format='%.9Y %n' -- PATH...` (a line per existing path; missing ones are
    left out). inputs: [{instance, path}]; instance '' is an input of every instance.
    One command each instead of a task per file: a re-run pays per remote call."""
    mtimes = {}
    for line in str(stat_stdout or '').splitlines():
        epoch, _, path = line.partition(' ')
        if path:
            mtimes[path] = float(epoch)
    stale = []
    for name, props in _vllm_units_shown(show_stdout):
        started = props.get('ExecMainStartTimestamp', '').strip().lstrip('@')
        if not started:
            continue
        changed = [mtimes[i['path']] for i in inputs or [] if i['instance'] in ('', name) and i['path'] in mtimes]
        if changed and max(changed) > float(started):
            stale.append(name)
    return stale


def unit_started_before(show_stdout, stat_stdout):
    """Whether one unit's main process started before one of its input files last changed: a run wrote them and
    stopped before the restart that would read them (the restart it notified is lost with the run).
    show_stdout: `systemctl show --timestamp=unix --property=ExecMainStartTimestamp UNIT` ('@<epoch>', empty when it
    is not running: False); stat_stdout: `stat --format='%.9Y %n' -- PATH...` (a line per existing path)."""
    props = dict(line.split('=', 1) for line in str(show_stdout or '').splitlines() if '=' in line)
    started = props.get('ExecMainStartTimestamp', '').strip().lstrip('@')
    mtimes = [float(line.partition(' ')[0]) for line in str(stat_stdout or '').splitlines() if line.partition(' ')[2]]
    return bool(started) and bool(mtimes) and max(mtimes) > float(started)


def vllm_unloaded_instances(show_stdout):
    """[instance name] whose unit file systemd has not loaded (NeedDaemonReload=yes in the same `systemctl show`
    as vllm_stale_instances, which asks for that property too): a run wrote it and stopped before its reload. A
    re-run reloads only when it writes the unit itself, so these restart with a reload (tasks/restart_one.yml)."""
    return [name for name, props in _vllm_units_shown(show_stdout) if props.get('NeedDaemonReload', '').strip() == 'yes']


def router_argv(cfg, prefills, decodes):
    """vllm-router's argv (after the binary). cfg: the router role's settings without the vllm_router_
    prefix (kv_connector, host, port, prefill_policy, decode_policy, prometheus_host, prometheus_port,
    max_concurrent_requests, health_check_interval_secs, health_failure_threshold,
    health_success_threshold, request_timeout_secs, extra_args); prefills: [{url, bootstrap_port}];
    decodes: [url]. With the mooncake connector each --prefill carries its bootstrap port."""
    a = ['--vllm-pd-disaggregation', '--kv-connector', str(cfg['kv_connector'])]
    for p in prefills or []:
        a += ['--prefill', str(p['url'])] + ([str(p['bootstrap_port'])] if cfg['kv_connector'] == 'mooncake' else [])
    for d in decodes or []:
        a += ['--decode', str(d)]
    return a + router_common_flags(cfg)


def router_common_flags(cfg):
    """The flags both router programs take alike (vllm-router's and smg's --help spell them the same): address,
    policies, metrics, limits, health checks, then the operator's extra_args. cfg as router_argv takes it."""
    a = ['--host', str(cfg['host']), '--port', str(cfg['port']),
         '--prefill-policy', str(cfg['prefill_policy']), '--decode-policy', str(cfg['decode_policy']),
         '--prometheus-host', str(cfg['prometheus_host']), '--prometheus-port', str(cfg['prometheus_port'])]
    if int(cfg.get('max_concurrent_requests') or 0) > 0:
        a += ['--max-concurrent-requests', str(cfg['max_concurrent_requests'])]
    a += ['--health-check-interval-secs', str(cfg['health_check_interval_secs']),
          '--health-failure-threshold', str(cfg['health_failure_threshold']),
          '--health-success-threshold', str(cfg['health_success_threshold'])]
    if int(cfg.get('request_timeout_secs') or 0) > 0:
        a += ['--request-timeout-secs', str(cfg['request_timeout_secs'])]
    return a + [str(x) for x in cfg.get('extra_args') or []]


def _boollike(value):
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ('true', 'yes', 'on', '1'):
        return True
    if str(value).strip().lower() in ('false', 'no', 'off', '0'):
        return False
    raise AnsibleFilterError('not a boolean or auto: %r' % (value,))


def master_ha(setting, masters):
    """HA masters: 'auto' is HA with 2 or more masters; true/false force it."""
    if str(setting).strip().lower() == 'auto':
        return len(masters or []) > 1
    return _boollike(setting)


def metadata_backend(setting, ha):
    """'auto' resolves to etcd with HA masters: the HTTP metadata server lives in one master's memory,
    so restarting that master (leader or standby) would lose every engine's segment metadata."""
    if str(setting) == 'auto':
        return 'etcd' if ha else 'http'
    return str(setting)


def master_http_metadata(host, groups, hostvars):
    """Whether host's Mooncake master runs its HTTP metadata server (a 0.0.0.0 listener with no auth):
    mooncake_master_http_metadata_server true/false, or auto (the default): only when an instance reads it,
    i.e. store mode (MooncakeStoreConnector) with the http metadata backend. P2P mode never does."""
    setting = host_cfg(host, hostvars).get('mooncake_master_http_metadata_server', 'auto')
    if str(setting).strip().lower() != 'auto':
        return _boollike(setting)
    if not store_mode(groups, hostvars):  # the store tier's clients handshake directly (P2PHANDSHAKE)
        return False
    masters = groups.get('mooncake_master') or []
    vllm = list(groups.get('vllm_prefill') or []) + list(groups.get('vllm_decode') or [])
    ha = master_ha(host_cfg(host, hostvars).get('mooncake_master_ha', 'auto'), masters)
    return metadata_backend(host_cfg(vllm[0], hostvars).get('mooncake_metadata_backend', 'auto') if vllm else 'auto', ha) == 'http'


_ROLES_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'roles'))
_DEFAULTS_CACHE = {}


def _preflight():
    """plugins/filter/preflight.py (reads the roles' defaults), imported when first needed (it is not needed to
    import this file)."""
    from ansible_collections.pd_bundle.serving.plugins.filter import preflight
    return preflight


def role_defaults(roles_dir=None):
    """Every role's literal defaults, merged (read once per process)."""
    roles_dir = os.path.normpath(roles_dir or _ROLES_DIR)
    if roles_dir not in _DEFAULTS_CACHE:
        pre = _preflight()
        _DEFAULTS_CACHE[roles_dir] = (pre, pre.load_roles(roles_dir)['defaults'])
    return _DEFAULTS_CACHE[roles_dir]


def pd_bundle_warm():
    """Called once in the controller before the workers fork (plugins/callback/pd_bundle_speedups.py): the roles'
    defaults, parsed there once, are inherited by every worker instead of read again by each."""
    role_defaults()


# Ansible's path filters, which a default rendered here may apply to a setting (they are os.path's).
PATH_FILTERS = {'basename': os.path.basename, 'dirname': os.path.dirname}
_PLACEHOLDER = re.compile(r'\{\{\s*([A-Za-z_][A-Za-z0-9_]*)((?:\s*\|\s*(?:%s))*)\s*\}\}' % '|'.join(PATH_FILTERS))


def _fill(match, cfg):
    value = str(cfg[match.group(1)])
    for name in re.findall(r'[a-z]+', match.group(2)):
        value = PATH_FILTERS[name](value)
    return value


def host_cfg(host, hostvars, roles_dir=None):
    """host's effective value of every variable a role defaults.

    A default that is a template made only of "{{ name }}" placeholders over other settings, each plain or
    through path filters (etcd_ca_file: "{{ etcd_cert_dir }}/ca.crt", vllm_served_model_name:
    "{{ vllm_model | basename }}"), is rendered from them; other templated defaults (facts, other filters)
    are left out. Computed once per worker process (_worker_cached); each caller gets its own copy.
    """
    return dict(_worker_cached('cfg', (id(hostvars), str(host), roles_dir), lambda: _host_cfg(host, hostvars, roles_dir)))


def _host_cfg(host, hostvars, roles_dir):
    pre, defaults = role_defaults(roles_dir)
    cfg = pre.effective(_hv(hostvars, host), defaults)
    pending = {k: v for k, v in defaults.items() if k not in cfg and isinstance(v, str) and '{{' in v
               and not _PLACEHOLDER.sub('', v).count('{')}
    for _ in range(3):  # chains of placeholders, a few deep
        for key, tmpl in list(pending.items()):
            names = [m.group(1) for m in _PLACEHOLDER.finditer(tmpl)]
            if all(isinstance(cfg.get(n), (str, int)) and not isinstance(cfg.get(n), bool) for n in names):
                cfg[key] = _PLACEHOLDER.sub(lambda m: _fill(m, cfg), tmpl)
                del pending[key]
    return cfg


def _pin(cfg, package_var, version_var):
    return '%s==%s' % (cfg.get(package_var), cfg.get(version_var))


# The venvs the bundle builds, each installed from its hash-locked file common_pip_lock_dir/<name>.txt
# (roles/common/tasks/venv.yml): the role flag of the hosts that build it (the preflight checks' _roles) and its
# pinned packages from a host's settings. The roles' install tasks and preflight's packages_lock read this.
VENVS = {
    'mooncake': ('engine', lambda c: [_pin(c, 'mooncake_package', 'mooncake_version')]),
    'vllm': ('vllm', lambda c: [_pin(c, 'vllm_package', 'vllm_version'), _pin(c, 'mooncake_package', 'mooncake_version')]
             + list(c.get('vllm_pip_extra_packages') or [])),
    # Both router programs (vllm_router_implementation): moving a router between them changes its unit, not its venv.
    'vllm-router': ('router', lambda c: ['vllm-router==%s' % c.get('vllm_router_version'),
                                         'smg==%s' % c.get('vllm_router_smg_version')]),
}


def venv_pins(cfg, name):
    """The pinned packages (name==version) of venv name for a host with settings cfg (bundle_host_cfg)."""
    return VENVS[name][1](cfg)


def etcd_mooncake_hostports(etcd_hosts, hostvars):
    out = []
    for h in etcd_hosts or []:
        cfg = host_cfg(h, hostvars)
        tls = _truthy(cfg.get('etcd_tls_enabled'), False)
        out.append('%s:%s' % (host_ip(h, hostvars), cfg['etcd_mooncake_client_port'] if tls else cfg['etcd_client_port']))
    return out


class FilterModule(object):
    def filters(self):
        return {
            'bundle_host_cfg': host_cfg,
            'bundle_etcd_mooncake_hostports': etcd_mooncake_hostports,
            'bundle_host_ip': host_ip,
            'bundle_size_bytes': size_bytes,
            'bundle_is_size': is_size,
            'bundle_mooncake_store_cfg': mooncake_store_cfg,
            'bundle_store_tier_hosts': store_tier_hosts,
            'bundle_store_ssd_hosts': store_ssd_hosts,
            'bundle_vllm_tp': vllm_tp,
            'bundle_vllm_side_channel_ports': vllm_side_channel_ports,
            'bundle_mooncake_check_pairs': mooncake_check_pairs,
            'bundle_mooncake_check_argv': mooncake_check_argv,
            'bundle_vllm_engine_nics': vllm_engine_nics,
            'bundle_vllm_endpoints': vllm_endpoints,
            'bundle_router_argv': router_argv,
            'bundle_unit_started_before': unit_started_before,
            'bundle_router_bind': router_bind,
            'bundle_router_api_key': router_api_key,
            'bundle_router_local_url': router_local_url,
            'bundle_router_endpoints': router_endpoints,
            'bundle_master_local_url': master_local_url,
            'bundle_vllm_stale_instances': vllm_stale_instances,
            'bundle_vllm_unloaded_instances': vllm_unloaded_instances,
            'bundle_host_listeners': host_listeners,
            'bundle_host_roles': host_roles,
            'bundle_hosts': bundle_hosts,
            'bundle_role_packages': role_packages,
            'bundle_host_packages': host_packages,
            'bundle_firewall_source_classes': firewall_source_classes,
            'bundle_firewall_plan': firewall_plan,
            'bundle_listener_port_table': listener_port_table,
            'bundle_master_ha': master_ha,
            'bundle_metadata_backend': metadata_backend,
            'bundle_venv_pins': venv_pins,
            'bundle_master_http_metadata': master_http_metadata,
            'bundle_run_as_argv': run_as_argv,
        }
