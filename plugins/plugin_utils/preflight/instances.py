"""Preflight checks of the classes gpus, instances, ports: the vLLM instances of a prefill/decode host and the fixed
ports of every host.

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import preflight as _pf

from .core import (NAME_RE, NIC_RE, PORT_VARS, _iname, _instances, _int, _is_list, _j, _lax_string, _option, _port,
                   _port_note, _roles, _truthy, check, refuse)


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
