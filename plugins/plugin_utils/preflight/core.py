"""The preflight checks' core: the registry (CHECKS, filled by @check as the group modules of this package are
imported, in preflight.GROUPS order), refuse (the one shape of a message), and the helpers and constants that more
than one group of checks uses. Every group module imports what it uses from here by name.

The sibling filter files it reads (preflight, bundle, managed, target_rules) are imported by the collection's fully
qualified name: under Ansible, the module its filter loader gave them; outside (pytest, scripts/lab), with the
collections directory on sys.path (tests/conftest.py, plugins/filter/siblings.py).
"""
import json
import os
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import managed as _managed
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf
from ansible_collections.pd_bundle.serving.plugins.filter import target_rules as _rules

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


def _vllm_pools(hostvars, groups):
    """(vllm_pools as the inventory writes it, {host: [instance name]}) from the vLLM hosts' settings."""
    cfgs = _cfgs(hostvars, (groups.get('vllm_prefill') or []) + (groups.get('vllm_decode') or []))
    routers = _cfgs(hostvars, groups.get('vllm_router') or [])
    written = next((cfg.get('vllm_pools') for _, cfg in cfgs + routers if cfg.get('vllm_pools')), None)
    return written, _pools.instance_names([h for h, _ in cfgs], dict(cfgs))


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


# --- helpers of more than one group of checks (settings and instances; fleet, sandbox and store; addresses and entry;
# tls and entry) ---------------------------------------------------------------------------------------------------

def _port_note(value):
    """A note naming the port suffix of "ADDR:PORT" (for the messages of a value that is no IP), '' otherwise."""
    hostport = _port_suffix(value)
    return ' (it has a port suffix, :%s; the setting takes the address alone)' % hostport[1] if hostport else ''


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


def _model_src_problem(src, model):
    """What is wrong with shipping a model from the controller (vllm_model_src, or a pool's model_src) to MODEL on the
    host: None (no src, or a usable one), 'src' (not a directory on the controller), 'model' (no absolute
    destination). The checks of vllm_model_src and of the pools' models word it for their own variables."""
    if src is None or src == '' or src == []:
        return None
    if not (isinstance(src, str) and os.path.isdir(src)):
        return 'src'
    return None if str(model or '').startswith('/') else 'model'


def _tls_path_problem(value, where):
    """Why value cannot be a TLS path (a phrase), None when it can."""
    text = value.strip()
    if not text:
        return 'is empty'
    if not (os.path.expanduser(text) if where == 'controller' else text).startswith('/'):
        return 'is not an absolute path'
    return None
