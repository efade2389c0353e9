"""What Prometheus scrapes in a bundle inventory, defined once (the monitoring role's file_sd files and
scrape_configs, its render for an operator's own Prometheus, and the unit tests all read this).

- scrape_targets(groups, hostvars, pools): {job: {scheme, tls, metrics_path, targets}} where targets is the job's
  file_sd list ([{targets: ['ip:port'], labels: {...}}], one entry per target). Addresses and ports come from
  the bundle's own definitions, never restated here: every vLLM instance from bundle_vllm_endpoints (its /metrics
  shares the API port), every other port from bundle_host_cfg (the roles' defaults overlaid by the inventory),
  every address from bundle_host_ip.

Jobs (JOBS order):
  vllm             every prefill/decode instance; labels role (prefill|decode), host, vllm_instance,
                   instance = "<host>/<instance name>"
  vllm_router      each router's Prometheus exporter (vllm_router_prometheus_port)
  mooncake_master  each master's metrics port (mooncake_master_metrics_port)
  mooncake_store_client
                   each SSD-tier prefill host's mooncake-store-client (bundle_store_ssd_hosts: vllm_store_tier and
                   vllm_store_ssd), its /metrics port (vllm_store_ssd_http_port): the SSD reads and writes
  etcd             each member's metrics listener (etcd_metrics_port); https with the bundle's client certificate
                   (tls: true) when etcd_tls_enabled, else http
  node             prometheus-node-exporter (monitoring_node_exporter_port) on every bundle host (bundle_hosts),
                   once per host, when the bundle runs them (a monitoring group: bundle_host_roles); on the masters its textfile collector carries pd_mooncake_master_leader (the
                   election watchdog's sample of /health: the masters export no leader metric)
  prometheus       each monitoring host's Prometheus (monitoring_prometheus_port)
  alertmanager     each monitoring host's Alertmanager (monitoring_alertmanager_port)
Every target carries labels host (inventory name) and instance (the host, or host/instance for vLLM), so alerts
and dashboards name inventory hosts, not addresses. A job without hosts has an empty target list.
With model pools (vllm_pools, docs/pools.md: pools, the normalized list of plugins/filter/pools.py) every vllm target
also carries pool (its instance's pool) and every vllm_router target its router's pool, so the recording rules,
alerts and dashboard group by it (pooled); without them (the one implicit pool) the labels are those above.

- dashboard_pools(dashboard, pooled): the Grafana dashboard (templates/monitoring/pd-dashboard.json, parsed) for the
  inventory: as it is without model pools; with them a 'model_pool' variable, every vLLM and router query filtered by
  it and grouped by pool, its legend led by the pool.
"""
import copy
import re

from ansible_collections.pd_bundle.serving.plugins.filter import bundle as _bundle
from ansible_collections.pd_bundle.serving.plugins.filter import pools as _pools
from ansible_collections.pd_bundle.serving.plugins.filter import status as _status

JOBS = ('vllm', 'vllm_router', 'mooncake_master', 'mooncake_store_client', 'etcd', 'node', 'prometheus', 'alertmanager')
VLLM_ROLES = (('vllm_prefill', 'prefill'), ('vllm_decode', 'decode'))


def _hostport(ip, port):
    return '%s:%s' % ('[%s]' % ip if ':' in str(ip) else ip, port)


def _target(ip, port, host, **labels):
    out = {'host': str(host), 'instance': str(host)}
    out.update({k: str(v) for k, v in labels.items()})
    return {'targets': [_hostport(ip, port)], 'labels': out}


def _per_host(hosts, hostvars, port_var):
    return [_target(_bundle.host_ip(h, hostvars), _bundle.host_cfg(h, hostvars)[port_var], h) for h in hosts or []]


def pooled(pools):
    """Whether the inventory has model pools (vllm_pools): then targets, rules and dashboard carry the pool label;
    the implicit pool of an inventory without them adds nothing (its files stay as before pools)."""
    return bool(_pools.explicit_pools(pools))


def scrape_targets(groups, hostvars, pools=None):
    groups = {k: list(v or []) for k, v in (groups or {}).items()}
    jobs = {name: {'scheme': 'http', 'tls': False, 'metrics_path': '/metrics', 'targets': []} for name in JOBS}
    with_pool = pooled(pools)
    for group, role in VLLM_ROLES:
        for e in _bundle.vllm_endpoints(groups.get(group), hostvars):
            pool = {'pool': _pools.bundle_pool_of(pools, e['host'], e['name'])} if with_pool else {}
            jobs['vllm']['targets'].append(_target(e['ip'], e['port'], e['host'], role=role, vllm_instance=e['name'],
                                                   instance='%s/%s' % (e['host'], e['name']), **pool))
    jobs['vllm_router']['targets'] = _per_host(groups.get('vllm_router'), hostvars, 'vllm_router_prometheus_port')
    if with_pool:
        for t in jobs['vllm_router']['targets']:
            t['labels']['pool'] = _pools.bundle_router_pool(pools, t['labels']['host'])['name']
    jobs['mooncake_master']['targets'] = _per_host(groups.get('mooncake_master'), hostvars, 'mooncake_master_metrics_port')
    jobs['mooncake_store_client']['targets'] = _per_host(_bundle.store_ssd_hosts(groups, hostvars), hostvars,
                                                         'vllm_store_ssd_http_port')
    etcd = groups.get('etcd') or []
    jobs['etcd']['targets'] = _per_host(etcd, hostvars, 'etcd_metrics_port')
    # The members share one scheme (the etcd role's setting applies to the whole cluster); the first one's.
    if etcd and _bundle._truthy(_bundle.host_cfg(etcd[0], hostvars).get('etcd_tls_enabled'), False):
        jobs['etcd'].update(scheme='https', tls=True)
    # Where the bundle runs a node exporter (bundle_host_roles: only with a monitoring group), not every bundle host:
    # an export for your own Prometheus must not list exporters nobody installed.
    nodes = [h for h in _bundle.bundle_hosts(groups) if _bundle.host_roles(h, groups)['node_exporter']]
    jobs['node']['targets'] = _per_host(nodes, hostvars, 'monitoring_node_exporter_port')
    jobs['prometheus']['targets'] = _per_host(groups.get('monitoring'), hostvars, 'monitoring_prometheus_port')
    jobs['alertmanager']['targets'] = _per_host(groups.get('monitoring'), hostvars, 'monitoring_alertmanager_port')
    return jobs


# Units beside those playbooks/status.yml expects, by the role that runs them.
EXTRA_UNITS = {'master': ['mooncake-master-watchdog'], 'entry': ['haproxy', 'keepalived'],
               'monitoring': ['prometheus', 'prometheus-alertmanager']}


# The SSD tier's store client, on bundle_store_ssd_hosts (a setting, not an inventory group: no host_roles key).
STORE_SSD_UNIT = _bundle.STORE_SSD_UNIT


def monitored_units(host, groups, hostvars):
    """The bundle's systemd units on host, for the node exporter's systemd collector (alert UnitDown): what
    playbooks/status.yml expects there (etcd, mooncake-master, vllm@<instance>, vllm-router), EXTRA_UNITS of
    the roles host runs and STORE_SSD_UNIT on the SSD tier's hosts. A unit the host does not have (keepalived with
    one entry host) has no series."""
    names = list(_status.bundle_status_expected(dict(groups, all=[host]), hostvars).get(host, []))
    roles = _bundle.host_roles(host, groups)
    names += [u for role, units in EXTRA_UNITS.items() if roles.get(role) for u in units]
    if host in _bundle.store_ssd_hosts(groups, hostvars):
        names.append(STORE_SSD_UNIT)
    return names


def unit_include(host, groups, hostvars):
    """--collector.systemd.unit-include for host: its monitored_units as one regex (no backslash: the /etc/default
    file is read by systemd, which would unescape it)."""
    return '(%s)[.]service' % '|'.join(n.replace('.', '[.]') for n in monitored_units(host, groups, hostvars))


# The series that carry the pool label (scrape_targets): the vllm and vllm_router jobs' and the vLLM recording rules'
# (pd:vllm_*, pd:decode_*: rules.yml.j2 keeps the pool). The dashboard's variable 'pool' is the role (prefill|decode),
# from before model pools, hence 'model_pool'.
_POOL_MATCH = 'pool=~"$model_pool"'
_POOLED_JOB = re.compile(r'\{job="(vllm|vllm_router)"')
_POOLED_RULE = re.compile(r'(pd:(?:vllm|decode)_[a-z0-9_]+:[a-z0-9_]+)(\{?)')
_MODEL_POOL_VAR = {'name': 'model_pool', 'label': 'model pool', 'type': 'query',
                   'datasource': {'type': 'prometheus', 'uid': '${datasource}'},
                   'query': {'query': 'label_values(up{job="vllm"}, pool)', 'refId': 'model_pool'},
                   'definition': 'label_values(up{job="vllm"}, pool)', 'includeAll': True, 'multi': True,
                   'allValue': '.*', 'refresh': 2, 'current': {}, 'hide': 0}


def _pool_expr(expr):
    """expr filtered by the model_pool variable and grouped by pool, when it reads pooled series; else None."""
    out = _POOLED_JOB.sub(lambda m: '{job="%s", %s' % (m.group(1), _POOL_MATCH), expr)
    out = _POOLED_RULE.sub(lambda m: m.group(1) + ('{%s, ' % _POOL_MATCH if m.group(2) else '{%s}' % _POOL_MATCH), out)
    return None if out == expr else out.replace('by (', 'by (pool, ')


def dashboard_pools(dashboard, pooled):
    if not pooled:
        return dashboard
    out = copy.deepcopy(dashboard)
    variables = out.setdefault('templating', {}).setdefault('list', [])
    variables.insert(1 if variables and variables[0].get('type') == 'datasource' else 0, dict(_MODEL_POOL_VAR))
    for var in variables:
        if var.get('name') == 'instance':
            for holder, key in ((var, 'definition'), (var.get('query') or {}, 'query')):
                if isinstance(holder.get(key), str):
                    holder[key] = _pool_expr(holder[key]) or holder[key]
    for panel in out.get('panels') or []:
        for target in panel.get('targets') or []:
            expr = _pool_expr(target.get('expr') or '')
            if expr:
                target['expr'] = expr
                target['legendFormat'] = '{{pool}} ' + target.get('legendFormat', '')
    return out


class FilterModule(object):
    def filters(self):
        return {'bundle_scrape_targets': scrape_targets, 'bundle_monitoring_pooled': pooled,
                'bundle_dashboard_pools': dashboard_pools,
                'bundle_monitored_units': monitored_units,
                'bundle_unit_include': unit_include}
