"""Render the cluster status table of playbooks/status.yml.

- bundle_status_red:   the reasons the cluster is red (an empty list means green)
- bundle_status_table: the cluster as one text block: a unit table, then the transfer matrix
- bundle_status_expected: {host: [units the inventory puts there]} (groups | bundle_status_expected(hostvars))
- bundle_status_host_rows: one host's unit rows from what its probes returned (see host_rows)
- bundle_status_units: every expected unit's row; a host that did not report gets 'unreachable' rows
- bundle_status_gpu_host: one vLLM host's GPU line (driver, CUDA, persistence, fabric manager, GPUDirect)
- bundle_status_entry_host: one entry host's line (HAProxy, keepalived, the VIP, HAProxy's routers, TLS days)
- bundle_status_monitoring_host: one monitoring host's line (Prometheus targets up/total, Alertmanager)
- bundle_status_reported: each host's line of a section (a fact it set), 'unreachable' for one that did not report

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
  pools: the model pools (plugins/filter/pools.py's bundle_inventory_pools; optional). With vllm_pools the unit
         table has a pool column and its rows grouped by pool (a vLLM instance's, a router's; '-' first: the units
         the pools share), and one transfer matrix per pool of its own instance pairs (the only ones measured);
         without them (the one implicit pool) the table is as before pools
  transfers: [{source, target (hosts), source_instance, target_instance, ok, gbps (Gbit/s, as
              mooncake-check reports it), ratio, min_ratio, floor_met, error}]; one per instance pair,
              so a matrix cell (host pair) may hold several: it shows the slowest, and is red if any is

  canary: the PD canary's state file of each router host that has one (plugins/tools/pd_canary.py: history per
         pair 'prefill host/instance|decode host/instance', failures): each matrix cell gains the canary of its
         instance pairs, what the instances themselves can do (the transfer check measures a fresh engine). A pair
         is broken when it failed its last `failures` canaries on every router host that ran it (PDPairBroken's
         rule); a broken pair is red

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

  entry_vip: the VIP with 2+ entry hosts ('' with one: no keepalived, no VIP line)
  entry_hosts: one line per entry host (bundle_status_entry_host): host, haproxy, keepalived, vrrp, vip_held,
         servers (HAProxy's view of its routers), cert_days, warn_days, problems
  monitoring_hosts: one line per monitoring host (bundle_status_monitoring_host): host, prometheus, targets_up,
         targets_total, targets_down, alertmanager, alertmanager_healthy, problems
Red (entry): the VIP on no entry host or on two or more; per entry host: HAProxy not running or its stats not read,
a server (router) of HAProxy's not UP, keepalived not running or in FAULT, or its state disagreeing with the
address (MASTER without the VIP, BACKUP with it), the TLS certificate not read or expiring in fewer days than
entry_tls_warn_days. Red (monitoring): Prometheus not running, its targets not read, none, or one down;
Alertmanager not running or /-/healthy not 200. An entry or monitoring host that did not answer is red.
"""
import base64
import calendar
import csv
import itertools
import re
import time

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import gpu_checks as _gpu_checks
from ansible_collections.pd_bundle.serving.plugins.filter import mooncake_etcd as _mooncake_etcd
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
STORE_SSD_UNIT = _bundle.STORE_SSD_UNIT

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


def _model_pools(data):
    """The inventory's model pools, or [] without vllm_pools (the implicit pool: nothing is grouped)."""
    return _pools.explicit_pools(data.get('pools'))


def _unit_pool(unit, pools):
    """The pool of a unit's row: a vLLM instance's or a router's; None for the units the pools share (etcd, masters)."""
    name = str(unit.get('unit') or '')
    if name.startswith('vllm@'):
        return _pools.bundle_pool_of(pools, unit.get('host'), name[len('vllm@'):])
    if name == 'vllm-router':
        try:
            return _pools.bundle_router_pool(pools, unit.get('host'))['name']
        except ValueError:  # a router in no pool (preflight refuses it): shown with the shared units
            return None
    return None


def _matrices(data):
    """(pool or None, prefill hosts, decode hosts) of each transfer matrix: one per model pool, as the transfer check
    pairs only a pool's own instances (bundle_mooncake_check_pairs); one of every host pair without pools."""
    pools = _model_pools(data)
    if not pools:
        return [(None, data.get('prefills') or [], data.get('decodes') or [])]
    return [(p, _pools.pool_hosts(p, ('prefill',)), _pools.pool_hosts(p, ('decode',))) for p in pools]


def _in_pool(result, pool):
    """Whether a transfer's instance pair is POOL's (a result without instance names: its host pair is)."""
    if pool is None or not (result.get('source_instance') or result.get('target_instance')):
        return True
    members = {role: [[str(h), str(i)] for h, i in pool[role]] for role in ('prefill', 'decode')}
    return ([str(result.get('source')), str(result.get('source_instance'))] in members['prefill']
            and [str(result.get('target')), str(result.get('target_instance'))] in members['decode'])


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


def _transfer_cells(data):
    """(pool name or None, prefill host, decode host) -> its verdict, worked out once for the red list and the matrices
    (_matrices): verdict ('not run', 'failed', 'low' or 'ok'), results (its instance pairs), worst (the lowest ratio
    below the floor) and red (the reasons it is red, one per failing instance pair)."""
    seen, cells = _transfers(data), {}
    for pool, prefills, decodes in _matrices(data):
        for src, dst in itertools.product(prefills, decodes):
            results = [r for r in seen.get((src, dst)) or [] if _in_pool(r, pool)]
            low, red = [], ['transfer %s -> %s: not run' % (src, dst)] if not results else []
            for res in results:
                if not res.get('ok'):
                    red.append('transfer %s failed: %s' % (_pair_name(res), _txt(res.get('error'))))
                elif _below_floor(res):
                    low.append(res)
                    red.append('transfer %s: Mooncake/raw-TCP ratio %s below the floor %s'
                               % (_pair_name(res), _txt(res.get('ratio')), _txt(res.get('min_ratio'))))
            verdict = ('not run' if not results else 'failed' if not all(r.get('ok') for r in results)
                       else 'low' if low else 'ok')
            cells[(pool and pool['name'], src, dst)] = {
                'verdict': verdict, 'results': results, 'red': red,
                'worst': min(low, key=lambda r: r.get('ratio') or 0) if low else None}
    return cells


def _canary_pairs(data):
    """{(pool, pair key): {pool, prefill, decode, failures (fewest failed in a row over the router hosts), broken,
    runs}} from the canary states of the router hosts. Broken: FAILURES in a row on every router host that ran it."""
    out = {}
    for state in data.get('canary') or []:
        if not isinstance(state, dict):
            continue
        try:
            need = int(state.get('failures') or 3)
        except (TypeError, ValueError):
            need = 3
        for key, runs in (state.get('history') or {}).items():
            if '|' not in key or not runs:
                continue
            failed = len(runs) - len(''.join('x' if r == 'fail' else '.' for r in runs).rstrip('x'))
            prefill, decode = key.split('|', 1)
            e = out.setdefault((state.get('pool'), key), {'pool': state.get('pool'), 'prefill': prefill, 'decode': decode,
                                                          'failures': failed, 'broken': True, 'runs': 0})
            e['failures'] = min(e['failures'], failed)
            e['broken'] = e['broken'] and failed >= need
            e['runs'] += 1
    return out


def _ejected(data):
    """{instance: {since, why, ...}} the canaries hold out of rotation (ejection, issue 52), from every router
    host's canary state (only the pool's first router decides, so one state holds them)."""
    out = {}
    for state in data.get('canary') or []:
        out.update(((state or {}).get('ejected') or {}).get('out') or {})
    return out


def _canary_cell(pairs, src, dst, pool=None):
    """The canary of the instance pairs of one matrix cell (prefill host SRC, decode host DST; with POOL, that pool's
    pairs only), '' without any."""
    mine = [e for e in pairs.values() if e['prefill'].split('/')[0] == src and e['decode'].split('/')[0] == dst
            and (pool is None or e['pool'] == pool)]
    if not mine:
        return ''
    broken = [e for e in mine if e['broken']]
    if broken:
        return '%s canary broken (%s)' % (RED, ', '.join('%s -> %s' % (e['prefill'], e['decode']) for e in broken))
    return 'canary %d/%d ok' % (len([e for e in mine if e['failures'] == 0]), len(mine))


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
        red.extend(r for cell in _transfer_cells(data).values() for r in cell['red'])
    red.extend('canary %s -> %s: failed %d times in a row on every router host (PDPairBroken)'
               % (e['prefill'], e['decode'], e['failures']) for e in _canary_pairs(data).values() if e['broken'])
    red.extend('%s: out of every router\'s rotation since %s (the canary ejected it: %s)'
               % (name, time.strftime('%H:%M:%S', time.gmtime(o.get('since') or 0)), o.get('why', '?'))
               for name, o in sorted(_ejected(data).items()))
    red.extend(_vip_problems(data))
    red.extend('%s: %s' % (e.get('host'), p) for e in data.get('entry_hosts') or [] for p in e.get('problems') or [])
    red.extend('%s: %s' % (m.get('host'), p) for m in data.get('monitoring_hosts') or [] for p in m.get('problems') or [])
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


def _matrix_cell(cell, src, dst, links):
    if cell['verdict'] in ('not run', 'failed'):
        return '%s %s' % (RED, cell['verdict'])
    if cell['verdict'] == 'low':
        worst = cell['worst']
        return '%s ratio %s < %s' % (RED, _txt(worst.get('ratio')), _txt(worst.get('min_ratio')))
    ends = [links.get(src), links.get(dst)]
    link = None if None in ends else min(ends)
    slowest = min(float(r.get('gbps') or 0) for r in cell['results'])
    return '%s / link %s' % (_gbytes(slowest), _gbytes(link))


def bundle_status_table(data):
    """The cluster as one text block (print it with ansible.builtin.debug)."""
    data = data or {}
    units = data.get('units') or []
    red = bundle_status_red(data)
    leader = _has_leader(units)
    out = ['CLUSTER %s: %s' % (data.get('name') or 'cluster',
                               'GREEN' if not red else '%s, %d problem%s' % (RED, len(red), '' if len(red) == 1 else 's'))]
    pools = _model_pools(data)
    rows = []
    for unit in _pool_ordered(units, pools):
        rows.append([RED if _unit_red(unit) else OK] + ([_txt(unit['pool'])] if pools else [])
                    + [_txt(unit.get('host')), _txt(unit.get('unit')),
                       _state_text(unit), _txt(unit.get('version')), _health_cell(unit, leader)]
                    + _instance_cells(unit))
    out.extend(_table([''] + (['pool'] if pools else [])
                      + ['host', 'unit', 'state', 'version', 'health', 'gpus', 'nics', 'gid', 'link'], rows))
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
    canary = _canary_pairs(data)
    if prefills and decodes:
        out.append('')
        measured = data.get('transfer_check', True)
        if not measured:
            out.append('Transfers: not measured (status_transfer_check=false)')
        if measured or canary:
            out.append(('Transfers prefill -> decode, mooncake-check (GB/s, the slowest instance pair; beside it the link '
                        'rate, n/a over tcp)' if measured else 'Prefill -> decode')
                       + ('; canary: the instances\' own PD path, passed last time / pairs (pd-canary on the routers)'
                          if canary else ''))
            cells, links = _transfer_cells(data), _host_link(units)
            for pool, srcs, dsts in _matrices(data):
                name = pool and pool['name']
                rows = [[src] + [' | '.join(c for c in ((_matrix_cell(cells[(name, src, dst)], src, dst, links)
                                                          if measured else ''), _canary_cell(canary, src, dst, name)) if c)
                                 for dst in dsts]
                        for src in srcs]
                out.extend((['pool %s' % name] if pool else []) + _table(['prefill \\ decode'] + list(dsts), rows))
    out.extend(_entry_lines(data))
    out.extend(_monitoring_lines(data))

    if red:
        out.append('')
        out.append('RED:')
        out.extend('- ' + reason for reason in red)
    return '\n'.join(out)


def _pool_ordered(units, pools):
    """The unit rows, each with its pool (_unit_pool, looked up once), grouped by pool in the pools' order after the
    units the pools share; the rows as they are without pools."""
    if not pools:
        return units
    order = {p['name']: n for n, p in enumerate(pools)}
    keyed = [dict(u, pool=_unit_pool(u, pools)) for u in units]
    return sorted(keyed, key=lambda u: -1 if u['pool'] is None else order.get(u['pool'], len(order)))


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
    ssd = set(_bundle.store_ssd_hosts(groups, hostvars))
    for h in groups.get('all', []):
        names = []
        if h in groups.get('etcd', []):
            names.append('etcd')
        if h in groups.get('mooncake_master', []):
            names.append('mooncake-master')
        if h in vllm:
            names += ['vllm@%s' % i.get('name') for i in (hostvars[h].get('vllm_instances') or [])]
        if h in ssd:
            names.append(STORE_SSD_UNIT)
        if h in groups.get('vllm_router', []):
            names.append('vllm-router')
        out[h] = names
    return out


def bundle_status_host_rows(r):
    """One host's rows. r: {host, etcd, master, vllm_role ('prefill'|'decode'|None), router (bools),
    services (service_facts), etcd_version, etcd_health, master_health, master_pip, master_package,
    vllm_instances, vllm_versions, vllm_health (uri loop results), selection (rdma_instance_selection),
    protocol, router_pip, router_program (vllm_router_implementation), router_health}; uri results are what ansible.builtin.uri registered."""
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
    if r.get('store_ssd'):
        # The store's memory and SSD tier on this host: its /health answers {"status": "healthy"}.
        u, h = _unit(svc, STORE_SSD_UNIT), r.get('store_ssd_health') or {}
        hj = h.get('json') or {}
        ok = h.get('status', -1) == 200 and hj.get('status') == 'healthy'
        rows.append({'unit': STORE_SSD_UNIT, 'state': u.get('state'), 'status': u.get('status'),
                     'version': ((r.get('master_pip') or {}).get(r.get('master_package')) or [{}])[0].get('version'),
                     'health': 'healthy' if ok else 'unhealthy: ' + _trunc(hj.get('status') or h.get('msg') or 'no answer', 60),
                     'health_ok': ok})
    if r.get('router'):
        u, h = _unit(svc, 'vllm-router'), r.get('router_health') or {}
        hj = h.get('json') or {}
        status = h.get('status', -1)
        pre, dec = hj.get('prefill'), hj.get('decode')
        counts = (' (prefill %s/%s, decode %s/%s)' % (pre.get('healthy'), pre.get('total'), dec.get('healthy'), dec.get('total'))
                  if isinstance(pre, dict) and isinstance(dec, dict) else '')
        # Its workers against the inventory (plugins/filter/membership.py): red while they differ (issue 32).
        members = list(r.get('router_membership') or [])
        # The program the unit runs (vllm_router_implementation): its package's version, named when it is smg.
        program = str(r.get('router_program') or 'vllm-router')
        version = ((r.get('router_pip') or {}).get(program) or [{}])[0].get('version')
        rows.append({'unit': 'vllm-router', 'state': u.get('state'), 'status': u.get('status'),
                     'version': version if program == 'vllm-router' or version is None else '%s %s' % (program, version),
                     'health': ('ready' if status == 200 else 'readiness %s' % status) + counts
                     + ('; membership differs: ' + _trunc('; '.join(members), 120) if members else ''),
                     'health_ok': status == 200 and not members})
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


# ---- The entry (HAProxy, keepalived, the VIP) and the monitoring hosts ----

def _cmd_out(result):
    """A command's stdout when it ran and exited 0, else None (ansible.builtin.command's registered result)."""
    result = result or {}
    if result.get('skipped') or result.get('rc') != 0:
        return None
    return result.get('stdout') or ''


def _cmd_error(result, what):
    result = result or {}
    text = result.get('stderr') or result.get('msg') or 'rc %s' % result.get('rc')
    return '%s not read: %s' % (what, _trunc(' '.join(str(text).split()), 80))


def bundle_status_haproxy_servers(stat_csv):
    """HAProxy's servers from its `show stat` CSV (the header line starts '# pxname,svname,'): [{backend, server,
    status ('UP', 'UP 1/2', 'DOWN', 'MAINT', 'no check', ...)}]; FRONTEND and BACKEND lines are left out."""
    lines = [ln for ln in (stat_csv or '').splitlines() if ln.strip()]
    if not lines or not lines[0].startswith('# '):
        return []
    rows = csv.DictReader([lines[0][2:]] + lines[1:])
    return [{'backend': row.get('pxname'), 'server': row.get('svname'), 'status': (row.get('status') or '').strip()}
            for row in rows if row.get('svname') not in ('FRONTEND', 'BACKEND', None)]


def _server_up(server):
    """UP (also 'UP 1/2': one failed check of fall 2) or not checked; DOWN, MAINT, DRAIN, NOLB are not up."""
    status = server.get('status') or ''
    return status == 'UP' or status.startswith('UP ') or status == 'no check'


_MONTHS = dict((m, i) for i, m in enumerate(
    ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'], 1))


def bundle_status_cert_days(enddate, now=None):
    """Whole days until a certificate's notAfter ('notAfter=Mar  9 12:00:00 2027 GMT', openssl x509 -enddate),
    negative once expired; None when the text is not such a date. now: epoch seconds (default: this moment)."""
    m = re.search(r'notAfter=(\w{3})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})\s+GMT', enddate or '')
    if not m or m.group(1) not in _MONTHS:
        return None
    end = calendar.timegm((int(m.group(6)), _MONTHS[m.group(1)], int(m.group(2)),
                           int(m.group(3)), int(m.group(4)), int(m.group(5)), 0, 0, 0))
    return int((end - (time.time() if now is None else float(now))) // 86400)


def bundle_status_keepalived_state(journal):
    """keepalived's VRRP state from its journal (the last '(<instance>) Entering <STATE> STATE' line: MASTER, BACKUP,
    FAULT, ...); None when there is none (a journal rotated since keepalived last changed state)."""
    states = re.findall(r'Entering ([A-Z]+) STATE', journal or '')
    return states[-1] if states else None


def _vip_held(ip_addr, vip):
    """Whether `ip -o -4 addr show` lists vip (on any interface)."""
    return bool(vip) and re.search(r'\sinet\s+%s/' % re.escape(str(vip)), ip_addr or '') is not None


def _haproxy_problems(haproxy, stat, servers):
    if haproxy != 'running':
        return ['haproxy is %s' % haproxy]
    if stat is None:
        return []
    if not servers:
        return ['HAProxy has no servers (routers) in its stats']
    return ['HAProxy server %s/%s is %s' % (s['backend'], s['server'], s['status'] or '?')
            for s in servers if not _server_up(s)]


def _keepalived_problems(keepalived, vrrp, vip_held):
    if keepalived is None:  # one entry host: no keepalived
        return []
    if keepalived != 'running':
        return ['keepalived is %s' % keepalived]
    if vrrp == 'FAULT':
        return ['keepalived is in FAULT state (its check of the local HAProxy fails)']
    if vrrp == 'MASTER' and vip_held is False:
        return ['keepalived is MASTER but the VIP is not on this host']
    if vrrp and vrrp != 'MASTER' and vip_held:
        return ['keepalived is %s but this host holds the VIP' % vrrp]
    return []


def _tls_problems(days, warn_days):
    if days is None:
        return []
    if days < 0:
        return ['TLS certificate expired %d days ago' % -days]
    if days < int(warn_days):
        return ['TLS certificate expires in %d days, under entry_tls_warn_days (%d)' % (days, int(warn_days))]
    return []


def bundle_status_entry_host(r):
    """One entry host's line. r: {host, services (service_facts), keepalived (bool: 2+ entry hosts run it), vip,
    ip_addr, journal, stat, cert (ansible.builtin.command results: `ip -o -4 addr show`, keepalived's journal,
    HAProxy's `show stat`, `openssl x509 -enddate`), warn_days (entry_tls_warn_days), now (epoch seconds, optional)}."""
    svc = r.get('services') or {}
    haproxy = _unit(svc, 'haproxy').get('state') or 'absent'
    keepalived = (_unit(svc, 'keepalived').get('state') or 'absent') if r.get('keepalived') else None
    problems = []
    stat = _cmd_out(r.get('stat'))
    servers = bundle_status_haproxy_servers(stat) if stat is not None else []
    if stat is None and haproxy == 'running':
        problems.append(_cmd_error(r.get('stat'), "HAProxy's stats (master socket)"))
    problems += _haproxy_problems(haproxy, stat, servers)
    vip_held, vrrp = None, None
    if r.get('keepalived'):
        addrs = _cmd_out(r.get('ip_addr'))
        vip_held = None if addrs is None else _vip_held(addrs, r.get('vip'))
        if addrs is None:
            problems.append(_cmd_error(r.get('ip_addr'), 'addresses (ip addr)'))
        vrrp = bundle_status_keepalived_state(_cmd_out(r.get('journal'))) if keepalived == 'running' else None
        problems += _keepalived_problems(keepalived, vrrp, vip_held)
    cert = _cmd_out(r.get('cert'))
    days = bundle_status_cert_days(cert, r.get('now')) if cert is not None else None
    if days is None:
        problems.append(_cmd_error(r.get('cert'), 'TLS certificate') if cert is None
                        else 'TLS certificate end date not understood: %s' % _trunc(cert, 60))
    problems += _tls_problems(days, r.get('warn_days') or 0)
    return {'host': r.get('host'), 'haproxy': haproxy, 'keepalived': keepalived, 'vrrp': vrrp, 'vip_held': vip_held,
            'servers': servers, 'stats_read': stat is not None, 'cert_days': days,
            'warn_days': int(r.get('warn_days') or 0), 'problems': problems}


def bundle_status_prometheus_targets(targets):
    """Prometheus' /api/v1/targets?state=active answer (its JSON) -> {up, total, down: ['job/instance', ...]}; a target
    not scraped yet ('unknown') counts in total, not as down."""
    active = ((targets or {}).get('data') or {}).get('activeTargets') or []
    down = ['%s/%s' % ((t.get('labels') or {}).get('job'), (t.get('labels') or {}).get('instance'))
            for t in active if t.get('health') == 'down']
    return {'up': sum(1 for t in active if t.get('health') == 'up'), 'total': len(active), 'down': down}


def _prometheus_problems(prometheus, read, counts):
    if prometheus != 'running':
        return ['prometheus is %s' % prometheus]
    if read:
        return [read]
    if not counts['total']:
        return ['Prometheus has no scrape targets']
    if counts['down']:
        more = len(counts['down']) - 8
        return ['Prometheus targets %d/%d up; down: %s%s' % (counts['up'], counts['total'], ', '.join(counts['down'][:8]),
                                                              ' (+%d more)' % more if more > 0 else '')]
    return []


def bundle_status_monitoring_host(r):
    """One monitoring host's line. r: {host, services (service_facts), targets (uri of Prometheus'
    /api/v1/targets?state=active), alertmanager (uri of Alertmanager's /-/healthy)}."""
    svc = r.get('services') or {}
    prometheus = _unit(svc, 'prometheus').get('state') or 'absent'
    alertmanager = _unit(svc, 'prometheus-alertmanager').get('state') or 'absent'
    t = r.get('targets') or {}
    ok = t.get('status', -1) == 200 and isinstance(t.get('json'), dict) and t['json'].get('status') == 'success'
    counts = bundle_status_prometheus_targets(t.get('json') if ok else None)
    read = None if ok else "Prometheus' targets not read: %s %s" % (t.get('status', -1), _trunc(t.get('msg') or '', 60))
    problems = _prometheus_problems(prometheus, read, counts)
    am = r.get('alertmanager') or {}
    healthy = am.get('status', -1) == 200
    if alertmanager != 'running':
        problems.append('prometheus-alertmanager is %s' % alertmanager)
    elif not healthy:
        problems.append('Alertmanager /-/healthy: %s %s' % (am.get('status', -1), _trunc(am.get('msg') or '', 60)))
    return {'host': r.get('host'), 'prometheus': prometheus, 'targets_read': ok, 'targets_up': counts['up'],
            'targets_total': counts['total'], 'targets_down': counts['down'], 'alertmanager': alertmanager,
            'alertmanager_healthy': healthy, 'problems': problems}


def bundle_status_reported(hosts, hostvars, fact):
    """Each host's line of a section, the fact it set (_status_entry, _status_monitoring); a host that did not set
    it (unreachable, failed) gets {'host', 'unreachable': True, 'problems': ['host did not answer']}."""
    out = []
    for host in hosts or []:
        hv = hostvars[host] if host in hostvars else {}
        mine = hv[fact] if fact in hv else None
        out.append(mine if mine else {'host': host, 'unreachable': True, 'problems': ['host did not answer']})
    return out


def _vip_problems(data):
    """The VIP on exactly one entry host (with 2+ entry hosts; '' entry_vip: no keepalived, nothing to check)."""
    vip, hosts = data.get('entry_vip'), data.get('entry_hosts') or []
    if not vip or not hosts:
        return []
    holders = [e['host'] for e in hosts if e.get('vip_held')]
    if len(holders) > 1:
        return ['VIP %s on %d hosts: %s (keepalived should hold it on one)' % (vip, len(holders), ', '.join(holders))]
    if not holders:
        silent = [e['host'] for e in hosts if e.get('vip_held') is None]
        return ['VIP %s on no entry host%s' % (vip, ' that answered (not read: %s)' % ', '.join(silent) if silent else '')]
    return []


def _entry_lines(data):
    hosts = data.get('entry_hosts') or []
    if not hosts:
        return []
    vip = data.get('entry_vip')
    out = ['', 'Entry (HAProxy%s; routers as HAProxy sees them; TLS: days left, red under entry_tls_warn_days)'
           % (', keepalived, VIP %s' % vip if vip else '')]
    if vip:
        holders = [e['host'] for e in hosts if e.get('vip_held')]
        out.append('%s VIP %s: %s' % (RED if _vip_problems(data) else OK, vip,
                                      'on ' + ', '.join(holders) if holders else 'on no entry host'))
    rows = []
    for e in hosts:
        if e.get('unreachable'):
            rows.append([RED, _txt(e.get('host')), 'unreachable', '', '', '', ''])
            continue
        servers = e.get('servers') or []
        down = [s['server'] for s in servers if not _server_up(s)]
        routers = ('%d/%d up' % (len(servers) - len(down), len(servers)) + ('; down: ' + ','.join(down) if down else '')
                   if e.get('stats_read') else 'not read')
        keepalived = ('n/a (one entry host)' if e.get('keepalived') is None
                      else e['keepalived'] + (' ' + (e.get('vrrp') or '?') if e['keepalived'] == 'running' else ''))
        vip_cell = 'n/a' if e.get('keepalived') is None else {True: 'held', False: '-'}.get(e.get('vip_held'), '?')
        days = e.get('cert_days')
        tls = 'not read' if days is None else ('expired %d days ago' % -days if days < 0 else '%d days' % days)
        rows.append([RED if e.get('problems') else OK, _txt(e.get('host')), _txt(e.get('haproxy')), keepalived,
                     vip_cell, routers, tls])
    out.extend(_table(['', 'host', 'haproxy', 'keepalived', 'VIP', 'routers', 'TLS'], rows))
    return out


def _monitoring_lines(data):
    hosts = data.get('monitoring_hosts') or []
    if not hosts:
        return []
    rows = []
    for m in hosts:
        if m.get('unreachable'):
            rows.append([RED, _txt(m.get('host')), 'unreachable', '', ''])
            continue
        down = m.get('targets_down') or []
        targets = ('%d/%d up' % (m.get('targets_up') or 0, m.get('targets_total') or 0)
                   + ('; down: %s' % ','.join(down[:3]) + (' +%d' % (len(down) - 3) if len(down) > 3 else '') if down else '')
                   if m.get('targets_read') else 'not read')
        am = _txt(m.get('alertmanager')) + (', healthy' if m.get('alertmanager_healthy') else ', not healthy'
                                            if m.get('alertmanager') == 'running' else '')
        rows.append([RED if m.get('problems') else OK, _txt(m.get('host')), _txt(m.get('prometheus')), targets, am])
    return ['', 'Monitoring (Prometheus targets up of total, Alertmanager /-/healthy)'] + _table(
        ['', 'host', 'prometheus', 'targets', 'alertmanager'], rows)


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
            'bundle_status_entry_host': bundle_status_entry_host,
            'bundle_status_monitoring_host': bundle_status_monitoring_host,
            'bundle_status_reported': bundle_status_reported,
        }
