"""Preflight checks of the classes managed, values: the escape hatches that must not repeat what the bundle sets, and
values the services refuse or ignore (target_rules: vLLM, etcd, pip, systemd rules as data).

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import os
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import managed as _managed
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf
from ansible_collections.pd_bundle.serving.plugins.filter import smg as _smg
from ansible_collections.pd_bundle.serving.plugins.filter import target_rules as _rules

from .core import _iname, _instances, _is_list, _j, _option, _roles, check, refuse


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


# The flags that name workers (vllm-router emits the first two; smg takes its workers from the manifest only).
_WORKER_FLAGS = ('--prefill', '--decode', '--worker-urls')


def _router_flags(implementation):
    """Every flag the router's argv can emit (bundle_router_argv, or bundle_smg_argv for smg: the command line is
    its own table), and for smg --api-key (its launcher adds it in process)."""
    cfg = {k: '1' for k in ('kv_connector', 'host', 'port', 'prefill_policy', 'decode_policy', 'prometheus_host',
                            'prometheus_port', 'health_check_interval_secs', 'health_failure_threshold',
                            'health_success_threshold', 'manifest', 'discovery_interval_secs', 'shutdown_grace_secs')}
    cfg.update(max_concurrent_requests=1, request_timeout_secs=1, extra_args=[])
    if implementation == 'smg':
        # Its workers come from the manifest: one on the command line would be a worker the bundle does not know.
        argv = _smg.smg_argv(cfg) + ['--api-key'] + list(_WORKER_FLAGS)
    else:
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
    managed = _router_flags(str(cfg.get('vllm_router_implementation')))
    out = []
    for i, tok in enumerate(str(t) for t in tokens):
        flag = tok.split('=', 1)[0]
        if flag in managed:
            workers = flag in _WORKER_FLAGS
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
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', rel)
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


# --- the router program (vllm_router_implementation): what each one has ---------------------------------

@check('managed', role='router')
def router_implementation(cfg, host, groups, specs):
    """The router's policies are ones its program has (smg.POLICIES: vllm-router's consistent_hash is smg's
    consistent_hashing); smg runs P2P only (store mode, vllm-router's sequential nixl mode, is not built on smg); and
    smg's prefills carry the engine id it registers them with (an explicit vllm_router_prefill_urls entry needs one)."""
    impl = str(cfg.get('vllm_router_implementation'))
    if impl not in _smg.POLICIES:
        return []  # argument_specs refuses it
    out = []
    for kind in ('prefill', 'decode'):
        var = 'vllm_router_%s_policy' % kind
        sources = [(var, cfg.get(var))] + [
            ('vllm_pools[%s].settings.%s' % (p.get('name'), var), p['settings'][var]) for p in cfg.get('vllm_pools') or []
            if isinstance(p, dict) and isinstance(p.get('settings'), dict) and p['settings'].get(var) is not None
            and host in (p.get('routers') or [])]
        for name, value in sources:
            others = [i for i in _smg.IMPLEMENTATIONS if i != impl and str(value) in _smg.POLICIES[i][kind]]
            if value is None or str(value) in _smg.POLICIES[impl][kind] or (not others and name == var):
                continue  # a value no program has: argument_specs refuses it (a pool's setting has no spec)
            out.append(refuse(name, host, 'is not a %s policy of %s (vllm_router_implementation)%s' % (
                kind, impl, '; it is one of %s' % ', '.join(others) if others else ''),
                'choose one of %s, or set vllm_router_implementation to %s.' % (
                    ', '.join(_smg.POLICIES[impl][kind]), ' or '.join(others) if others else 'another program'),
                value=value))
    if impl == 'smg':
        mode = cfg.get('vllm_router_kv_connector')
        mode = mode if isinstance(mode, str) and '{' not in mode else (
            'nixl' if cfg.get('vllm_kv_connector') == _bundle.STORE_CONNECTOR else 'mooncake')  # the role's default
        if mode not in _smg.KV_CONNECTORS:
            out.append(refuse('vllm_router_implementation', host, 'is smg while the router runs %s PD mode '
                              '(vllm_kv_connector %s): smg with store mode is not built (its sequential mode was not run)'
                              % (mode, cfg.get('vllm_kv_connector')),
                              'set vllm_router_implementation: vllm-router for store mode, or vllm_kv_connector: '
                              'MooncakeConnector.', value=impl))
        urls = cfg.get('vllm_router_prefill_urls')
        for i, p in enumerate(urls if _is_list(urls) else []):
            if isinstance(p, dict) and not p.get('engine_id'):
                out.append(refuse('vllm_router_prefill_urls', host, 'item %d (%s) has no engine_id: smg registers a '
                                  'prefill with the Mooncake engine id its bootstrap server names, and one without it '
                                  'goes through passthrough (decode recomputes every prompt)' % (i, p.get('url')),
                                  'add engine_id (the instance\'s kv_transfer_config engine_id, <host>-<instance> by '
                                  'the bundle) to the entry.'))
    return out
