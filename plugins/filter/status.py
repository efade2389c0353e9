"""Render the cluster status table of playbooks/status.yml.

- bundle_status_red:   the reasons the cluster is red (an empty list means green)
- bundle_status_table: the cluster as one text block: a unit table, then the transfer matrix
- bundle_status_expected: {host: [units the inventory puts there]} (groups | bundle_status_expected(hostvars))
- bundle_status_host_rows: one host's unit rows from what its probes returned (see host_rows)
- bundle_status_units: every expected unit's row; a host that did not report gets 'unreachable' rows
- bundle_status_gpu_host: one vLLM host's GPU line (driver, CUDA, persistence, fabric manager, GPUDirect)

Input, one dict per cluster, assembled by the playbook from what each host reported:
  name:  cluster name
  units: one row per unit:
           host, unit ('etcd', 'mooncake-master', 'vllm@prefill0', 'vllm-router', ...),
           state ('running' = active; 'stopped', 'failed', 'absent', 'unreachable', ...),
           status (systemd's active/inactive/failed, shown when not running), version,
           health (text: 'healthy', 'leader', 'standby', 'serving', or what failed),
           health_ok (true, false, or null when not probed);
         vLLM rows also: role, port, gpus, protocol, nics, gid_index, rate_gbps (link rate, Gbit/s)
  transfer_check: whether the transfer matrix was measured (default true)
  prefills, decodes: host lists (matrix rows and columns)
  transfers: [{source, target (hosts), source_instance, target_instance, ok, gbps (Gbit/s, as
              mooncake-check reports it), ratio, min_ratio, floor_met, error}]; one per instance pair,
              so a matrix cell (host pair) may hold several: it shows the slowest, and is red if any is

  gpu_hosts: one line per vLLM host (bundle_status_gpu_host): host, platform, driver, cuda, gpus, persistence,
         fabric_manager, gpudirect, problems; a cpu host has platform 'cpu' and n/a elsewhere
  master_ha: whether the masters run HA (their leader is elected through etcd)
  master_views: etcd's master view as each etcd member read it (bundle_status_etcd_view); master rows also carry
         address (their own RPC ip:port) and leader_address (whom their /health follows)

Red: a unit not running, a failed health probe (unhealthy etcd member, unhealthy master, vLLM or
router /health not 200), no healthy master leader when there are masters, with HA masters etcd's
master view disagreeing with the masters (plugins/filter/mooncake_etcd.py: no key, no live lease, another
master than the leader), a failed or missing
transfer, a transfer whose Mooncake/raw-TCP ratio is below the protocol's floor (floor_met false), a cuda
host's GPU problem (no driver loaded; NVSwitch without an active fabric manager of the driver's version;
no GPUDirect path for rdma_gpudirect: plugins/filter/gpu_checks.py). Persistence off is shown, not red.
A tcp cluster (no RDMA) shows tcp and n/a for NICs, GID and link rate; that is not red.
"""
import base64
import os
import runpy

_load = runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'siblings.py'))['load']
_mooncake_etcd = _load('mooncake_etcd')
_gpu_checks = _load('gpu_checks')

RED = 'RED'
OK = 'ok'


def _txt(value, empty='-'):
    if value is None or value == '' or value == []:
        return empty
    if isinstance(value, (list, tuple)):
        return ','.join(str(v) for v in value)
    return str(value)


def _gbytes(gbits):
    """Gbit/s -> 'N.NN GB/s'."""
    if gbits is None:
        return 'n/a'
    return '%.2f GB/s' % (float(gbits) / 8.0)


def _state_text(unit):
    state = unit.get('state') or 'absent'
    status = unit.get('status')
    if state == 'running' or not status or status == state:
        return state
    return '%s (%s)' % (state, status)


def _masters(units):
    return [u for u in units if u.get('unit') == 'mooncake-master']


def _has_leader(units):
    return any(u.get('state') == 'running' and u.get('health') == 'leader' and u.get('health_ok')
               for u in _masters(units))


def _unit_red(unit):
    return unit.get('state') != 'running' or unit.get('health_ok') is False


def _host_link(units):
    """host -> the fastest selected RDMA port of its vLLM instances (Gbit/s), None over tcp."""
    links = {}
    for unit in units:
        rate = unit.get('rate_gbps')
        if unit.get('protocol') == 'rdma' and rate is not None:
            links[unit.get('host')] = max(float(rate), links.get(unit.get('host')) or 0.0)
    return links


def _transfers(data):
    """(source host, target host) -> the results of its instance pairs."""
    out = {}
    for t in data.get('transfers') or []:
        out.setdefault((t.get('source'), t.get('target')), []).append(t)
    return out


def _pair_name(t):
    names = [t.get('source'), t.get('target')]
    if t.get('source_instance') or t.get('target_instance'):
        names = ['%s/%s' % (h, i) for h, i in zip(names, [t.get('source_instance'), t.get('target_instance')])]
    return '%s -> %s' % tuple(names)


def _below_floor(t):
    return t.get('ok') and t.get('floor_met') is False


def _etcd_view(data):
    """etcd's master view: the first member's read that succeeded, else why none did."""
    reads = [v for v in data.get('master_views') or [] if v]
    for v in reads:
        if not v.get('error'):
            return v
    return {'error': '; '.join('%s: %s' % (v.get('host'), v.get('error')) for v in reads) or 'no etcd member reported'}


def _masters_view(units):
    """The masters' own view (mooncake_etcd.master_view_problems' masters) from their rows."""
    return [{'host': u.get('host'), 'address': u.get('address'), 'role': u.get('health'),
             'healthy': u.get('state') == 'running' and bool(u.get('health_ok')),
             'leader_address': u.get('leader_address')} for u in _masters(units)]


def _master_view_red(data):
    if not (data.get('master_ha') and _masters(data.get('units') or [])):
        return []
    return _mooncake_etcd.master_view_problems(_etcd_view(data), _masters_view(data.get('units') or []))


def _master_view_line(data):
    """'Master leader: ...': the masters' own view beside etcd's; None without HA masters."""
    units = data.get('units') or []
    if not (data.get('master_ha') and _masters(units)):
        return None
    masters = _masters_view(units)
    by_addr = {m['address']: m['host'] for m in masters}
    leaders = ['%s (%s)' % (m['host'], m['address']) for m in masters if m['healthy'] and m['role'] == 'leader']
    view = _etcd_view(data)
    if view.get('error'):
        etcd = 'not read (%s)' % view['error']
    elif not view.get('value'):
        etcd = 'no key'
    else:
        etcd = '%s (%s), lease TTL %s of %s s, read on %s' % (
            by_addr.get(view['value'], 'no master'), view['value'], _txt(view.get('lease_ttl')),
            _txt(view.get('granted_ttl')), view.get('host'))
    return '%s Master leader: masters say %s; etcd says %s' % (
        RED if _master_view_red(data) else OK, ', '.join(leaders) or 'none', etcd)


def bundle_status_red(data):
    """Reasons the cluster is red; an empty list means green."""
    data = data or {}
    units = data.get('units') or []
    red = []
    for unit in units:
        if unit.get('state') != 'running':
            red.append('%s: %s is %s' % (unit.get('host'), unit.get('unit'), _state_text(unit)))
        elif unit.get('health_ok') is False:
            red.append('%s: %s unhealthy: %s' % (unit.get('host'), unit.get('unit'), _txt(unit.get('health'))))
    if _masters(units) and not _has_leader(units):
        red.append('mooncake-master: no healthy leader')
    red.extend('mooncake-master: %s' % p for p in _master_view_red(data))
    red.extend('%s: %s' % (g.get('host'), p) for g in data.get('gpu_hosts') or [] for p in g.get('problems') or [])
    if data.get('transfer_check', True):
        seen = _transfers(data)
        for src in data.get('prefills') or []:
            for dst in data.get('decodes') or []:
                results = seen.get((src, dst))
                if not results:
                    red.append('transfer %s -> %s: not run' % (src, dst))
                for res in results or []:
                    if not res.get('ok'):
                        red.append('transfer %s failed: %s' % (_pair_name(res), _txt(res.get('error'))))
                    elif _below_floor(res):
                        red.append('transfer %s: Mooncake/raw-TCP ratio %s below the floor %s'
                                   % (_pair_name(res), _txt(res.get('ratio')), _txt(res.get('min_ratio'))))
    return red


def _table(headers, rows):
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    fmt = '  '.join('%%-%ds' % w for w in widths)
    lines = [fmt % tuple(headers), fmt % tuple('-' * w for w in widths)]
    lines.extend(fmt % tuple(row) for row in rows)
    return [line.rstrip() for line in lines]


def _instance_cells(unit):
    if not unit.get('unit', '').startswith('vllm@'):
        return ['', '', '', '']
    if unit.get('protocol') != 'rdma':
        return [_txt(unit.get('gpus')), _txt(unit.get('protocol')), 'n/a', 'n/a']
    rate = unit.get('rate_gbps')
    gid = unit.get('gid_index')
    return [_txt(unit.get('gpus')), _txt(unit.get('nics')), 'n/a' if gid is None else str(gid),
            'n/a' if rate is None else '%g Gb/s' % float(rate)]


def _health_cell(unit, leader):
    text = _txt(unit.get('health'))
    if unit.get('unit') == 'mooncake-master' and not leader and unit.get('health') == 'standby':
        return text + ' (no leader)'
    return text


def bundle_status_table(data):
    """The cluster as one text block (print it with ansible.builtin.debug)."""
    data = data or {}
    units = data.get('units') or []
    red = bundle_status_red(data)
    leader = _has_leader(units)
    out = ['CLUSTER %s: %s' % (data.get('name') or 'cluster',
                               'GREEN' if not red else '%s, %d problem%s' % (RED, len(red), '' if len(red) == 1 else 's'))]
    rows = []
    for unit in units:
        rows.append([RED if _unit_red(unit) else OK, _txt(unit.get('host')), _txt(unit.get('unit')),
                     _state_text(unit), _txt(unit.get('version')), _health_cell(unit, leader)]
                    + _instance_cells(unit))
    out.extend(_table(['', 'host', 'unit', 'state', 'version', 'health', 'gpus', 'nics', 'gid', 'link'], rows))
    view_line = _master_view_line(data)
    if view_line:
        out.extend(['', view_line])
    gpu_hosts = data.get('gpu_hosts') or []
    if gpu_hosts:
        out.extend(['', 'GPU stack per vLLM host (gpu_facts; cpu hosts: n/a)'])
        out.extend(_table(['', 'host', 'platform', 'driver', 'CUDA', 'GPUs', 'persistence', 'fabric manager', 'GPUDirect'],
                          [[RED if g.get('problems') else OK] + [_txt(g.get(k), 'n/a') for k in
                            ('host', 'platform', 'driver', 'cuda', 'gpus', 'persistence', 'fabric_manager', 'gpudirect')]
                           for g in gpu_hosts]))

    prefills, decodes = data.get('prefills') or [], data.get('decodes') or []
    if prefills and decodes:
        out.append('')
        if not data.get('transfer_check', True):
            out.append('Transfers: not measured (status_transfer_check=false)')
        else:
            out.append('Transfers prefill -> decode, mooncake-check (GB/s, the slowest instance pair; beside it the link rate, n/a over tcp)')
            seen, links = _transfers(data), _host_link(units)
            rows = []
            for src in prefills:
                row = [src]
                for dst in decodes:
                    results = seen.get((src, dst)) or []
                    low = [r for r in results if _below_floor(r)]
                    if not results:
                        row.append('%s not run' % RED)
                    elif not all(r.get('ok') for r in results):
                        row.append('%s failed' % RED)
                    elif low:
                        worst = min(low, key=lambda r: r.get('ratio') or 0)
                        row.append('%s ratio %s < %s' % (RED, _txt(worst.get('ratio')), _txt(worst.get('min_ratio'))))
                    else:
                        ends = [links.get(src), links.get(dst)]
                        link = None if None in ends else min(ends)
                        slowest = min(float(r.get('gbps') or 0) for r in results)
                        row.append('%s / link %s' % (_gbytes(slowest), _gbytes(link)))
                rows.append(row)
            out.extend(_table(['prefill \\ decode'] + list(decodes), rows))

    if red:
        out.append('')
        out.append('RED:')
        out.extend('- ' + reason for reason in red)
    return '\n'.join(out)


def _trunc(text, n):
    text = str(text)
    return text if len(text) <= n else text[:n - 3] + '...'


def _unit(services, name):
    return services.get(name + '.service') or {'state': 'absent', 'status': 'not loaded'}


def _get(d, key, default=None):
    return (d or {}).get(key, default) if isinstance(d, dict) else default


def bundle_status_expected(groups, hostvars):
    """{host: [unit names]}: what the inventory runs on every host, in the table's order."""
    out = {}
    vllm = set(groups.get('vllm_prefill', [])) | set(groups.get('vllm_decode', []))
    for h in groups.get('all', []):
        names = []
        if h in groups.get('etcd', []):
            names.append('etcd')
        if h in groups.get('mooncake_master', []):
            names.append('mooncake-master')
        if h in vllm:
            names += ['vllm@%s' % i.get('name') for i in (hostvars[h].get('vllm_instances') or [])]
        if h in groups.get('vllm_router', []):
            names.append('vllm-router')
        out[h] = names
    return out


def bundle_status_host_rows(r):
    """One host's rows. r: {host, etcd, master, vllm_role ('prefill'|'decode'|None), router (bools),
    services (service_facts), etcd_version, etcd_health, master_health, master_pip, master_package,
    vllm_instances, vllm_versions, vllm_health (uri loop results), selection (rdma_instance_selection),
    protocol, router_pip, router_health}; uri results are what ansible.builtin.uri registered."""
    svc, rows = r.get('services') or {}, []
    if r.get('etcd'):
        u, h = _unit(svc, 'etcd'), r.get('etcd_health') or {}
        content = h.get('content') or ''
        hj = {}
        if content.lstrip().startswith('{'):
            import json
            try:
                hj = json.loads(content)
            except ValueError:
                hj = {}
        healthy = h.get('status', -1) == 200 and hj.get('health') in ('true', True)
        rows.append({'unit': 'etcd', 'state': u.get('state'), 'status': u.get('status'),
                     'version': _get(_get(r.get('etcd_version'), 'json', {}), 'etcdserver'),
                     'health': 'healthy' if healthy else 'unhealthy: ' + _trunc(hj.get('reason') or h.get('msg') or 'no answer', 60),
                     'health_ok': healthy})
    if r.get('master'):
        u, h = _unit(svc, 'mooncake-master'), r.get('master_health') or {}
        pkg = ((r.get('master_pip') or {}).get(r.get('master_package')) or [{}])[0]
        hj = h.get('json') or {}
        ok = h.get('status', -1) == 200 and hj.get('status') == 'ok'
        rows.append({'unit': 'mooncake-master', 'state': u.get('state'), 'status': u.get('status'), 'version': pkg.get('version'),
                     'health': hj.get('role', 'no answer') if ok
                     else 'unhealthy: ' + _trunc(hj.get('status') or h.get('msg') or 'no answer', 60),
                     'health_ok': ok, 'address': r.get('master_address'), 'leader_address': hj.get('leader_address')})
    if r.get('vllm_role'):
        versions, health = r.get('vllm_versions') or [], r.get('vllm_health') or []
        for n, inst in enumerate(r.get('vllm_instances') or []):
            u = _unit(svc, 'vllm@' + str(inst.get('name')))
            v = versions[n] if n < len(versions) else {}
            h = health[n] if n < len(health) else {}
            sel = (r.get('selection') or {}).get(inst.get('name')) or {}
            rates = [p.get('rate_gbps') for p in sel.get('ports') or [] if p.get('rate_gbps')]
            status = h.get('status', -1)
            rows.append({'unit': 'vllm@' + str(inst.get('name')), 'state': u.get('state'), 'status': u.get('status'),
                         'version': _get(v.get('json'), 'version'),
                         'health': 'serving' if status == 200 else 'health %s %s' % (status, _trunc(h.get('msg') or '', 40)),
                         'health_ok': status == 200, 'role': r['vllm_role'], 'port': inst.get('port'),
                         'gpus': inst.get('gpus') or [], 'protocol': r.get('protocol'),
                         'nics': sel.get('nics', inst.get('nics') or []), 'gid_index': sel.get('gid_index'),
                         'rate_gbps': min(rates) if rates else None})
    if r.get('router'):
        u, h = _unit(svc, 'vllm-router'), r.get('router_health') or {}
        hj = h.get('json') or {}
        status = h.get('status', -1)
        pre, dec = hj.get('prefill'), hj.get('decode')
        counts = (' (prefill %s/%s, decode %s/%s)' % (pre.get('healthy'), pre.get('total'), dec.get('healthy'), dec.get('total'))
                  if isinstance(pre, dict) and isinstance(dec, dict) else '')
        rows.append({'unit': 'vllm-router', 'state': u.get('state'), 'status': u.get('status'),
                     'version': ((r.get('router_pip') or {}).get('vllm-router') or [{}])[0].get('version'),
                     'health': ('ready' if status == 200 else 'readiness %s' % status) + counts,
                     'health_ok': status == 200})
    return [dict(row, host=r.get('host')) for row in rows]


def _persistence(smi_gpus):
    modes = [g.get('persistence_mode') for g in smi_gpus]
    if not modes:
        return '?'
    off = sum(1 for m in modes if m == 'Disabled')
    return 'on' if not off else 'off on %d of %d' % (off, len(modes))


def _fabric_manager(facts):
    """(cell, problem or None): n/a without NVSwitch; else active/inactive and the version beside the driver's."""
    if not facts.get('nvswitches'):
        return 'n/a (no NVSwitch)', None
    fm, driver = facts.get('fabricmanager') or {}, facts.get('driver_version')
    state = {True: 'active', False: 'inactive'}.get(fm.get('active'), '?')
    cell = '%s %s' % (state, fm.get('version') or '?')
    if fm.get('active') is False:
        return cell, ('%d NVSwitch(es) but nvidia-fabricmanager is not active: NCCL and TP > 1 hang. Fix: systemctl '
                      'enable --now nvidia-fabricmanager' % len(facts['nvswitches']))
    if fm.get('version') and driver and fm['version'] != driver:
        return cell + ' != driver', ('nvidia-fabricmanager %s does not match driver %s. Fix: install the fabric '
                                     'manager of the driver\'s version' % (fm['version'], driver))
    return cell, None


def bundle_status_gpu_host(r):
    """One vLLM host's GPU line. r: {host, platform (vllm_platform), protocol, facts (ansible_facts.gpu; None when
    not read), gpudirect (the rdma role's resolved mode of this run, else rdma_gpudirect), load_modules}.
    Problems (red) reuse plugins/filter/gpu_checks.py: no driver, the fabric manager, no GPUDirect path."""
    host = r.get('host')
    if r.get('platform') != 'cuda':
        return {'host': host, 'platform': r.get('platform') or 'cpu', 'problems': []}
    facts = r.get('facts')
    if facts is None:
        return {'host': host, 'platform': 'cuda', 'driver': '?', 'problems': ['GPU facts not read (gpu_facts failed)']}
    smi = facts.get('smi') or {}
    problems = []
    if not facts.get('driver_version'):
        problems.append('no NVIDIA driver loaded. Fix: install the driver (gpu_driver_install) and reboot')
    fm_cell, fm_problem = _fabric_manager(facts)
    problems.extend([fm_problem] if fm_problem else [])
    if r.get('protocol') == 'rdma':
        load = r.get('load_modules', True) not in (False, 'false', 'False', 'no')
        mode = _gpu_checks.gpudirect_resolve(r.get('gpudirect'), facts, load)
        gpudirect = mode or '%s: no path' % _txt(r.get('gpudirect'))
        problems.extend(_gpu_checks.gpudirect_errors(r.get('gpudirect'), facts, host, load))
    else:
        gpudirect = 'n/a (%s)' % _txt(r.get('protocol'))
    return {'host': host, 'platform': 'cuda', 'driver': facts.get('driver_version') or 'none',
            'cuda': smi.get('cuda_version') or '?', 'gpus': len(facts.get('gpus') or []),
            'persistence': _persistence(smi.get('gpus') or []), 'fabric_manager': fm_cell, 'gpudirect': gpudirect,
            'problems': problems}


def bundle_status_etcd_view(r):
    """etcd's master view as one member read it: {host, value ('ip:port' or None: no key), lease_ttl (seconds
    left, None: no lease), granted_ttl, error (None when read)}; None when the member did not read it (no HA).
    r: {host, range, lease}: what ansible.builtin.uri registered for /v3/kv/range and /v3/lease/timetolive."""
    rng, lease = r.get('range') or {}, r.get('lease') or {}
    if not rng or rng.get('skipped'):
        return None
    out = {'host': r.get('host'), 'value': None, 'lease_ttl': None, 'granted_ttl': None, 'error': None}
    if rng.get('status', -1) != 200 or not isinstance(rng.get('json'), dict):
        out['error'] = 'range %s %s' % (rng.get('status', -1), _trunc(rng.get('msg') or '', 60))
        return out
    kvs = rng['json'].get('kvs') or []
    if not kvs:
        return out
    out['value'] = base64.b64decode(kvs[0].get('value') or '').decode(errors='replace')
    if kvs[0].get('lease') and not lease.get('skipped'):
        lj = lease.get('json') if lease.get('status', -1) == 200 else None
        if not isinstance(lj, dict):
            out['error'] = 'lease %s %s' % (lease.get('status', -1), _trunc(lease.get('msg') or '', 60))
            return out
        out['lease_ttl'], out['granted_ttl'] = int(lj.get('TTL', -1)), int(lj.get('grantedTTL', 0))
    return out


def bundle_status_units(expected, hostvars):
    """Every expected unit's row: a host's own rows (its _status_units fact) when it reported, else
    'unreachable' ones."""
    rows = []
    for host, names in (expected or {}).items():
        hv = hostvars[host] if host in hostvars else {}
        mine = hv['_status_units'] if '_status_units' in hv else None
        if mine is not None:
            rows.extend(mine)
        else:
            rows.extend({'host': host, 'unit': n, 'state': 'unreachable', 'health': 'host did not answer',
                         'health_ok': False} for n in names)
    return rows


class FilterModule(object):
    def filters(self):
        return {
            'bundle_status_red': bundle_status_red,
            'bundle_status_table': bundle_status_table,
            'bundle_status_expected': bundle_status_expected,
            'bundle_status_host_rows': bundle_status_host_rows,
            'bundle_status_units': bundle_status_units,
            'bundle_status_etcd_view': bundle_status_etcd_view,
            'bundle_status_gpu_host': bundle_status_gpu_host,
        }
