"""The Grafana dashboard (templates/monitoring/pd-dashboard.json): its rows (traffic, latency, KV transfer, queues,
master/etcd, hosts) and templating variables (pool, instance) exist, every panel query parses in the real promtool
(written as a rule group, Grafana's variables replaced by values), and every series a query reads is a recording
rule of templates/monitoring/rules.yml.j2 or a metric its exporter exports (KNOWN_METRICS). Fails without promtool.
That every query returns data from a live Prometheus is the lab's monitoring step (scripts/lab/monitoring-test.py)."""
import json
import re
import subprocess
from pathlib import Path

import yaml

from test_monitoring_rules import PROMTOOL, render_rules

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / 'templates' / 'monitoring' / 'pd-dashboard.json'
ROWS = ['Traffic', 'Latency', 'KV transfer', 'Queues', 'Master / etcd', 'Hosts']
# Raw metrics the panels may read, each from the exporter that serves it: vLLM's /metrics
# (vllm/v1/metrics/loggers.py), etcd's, prometheus-node-exporter's, and Prometheus' own up.
KNOWN_METRICS = {
    'up',
    'vllm:request_success_total', 'vllm:time_to_first_token_seconds_bucket', 'vllm:inter_token_latency_seconds_bucket',
    'vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:prompt_tokens_by_source_total',
    'vllm:prefix_cache_hits_total', 'vllm:prefix_cache_queries_total',
    'etcd_server_has_leader', 'etcd_server_leader_changes_seen_total', 'etcd_disk_wal_fsync_duration_seconds_bucket',
    'node_cpu_seconds_total', 'node_memory_MemAvailable_bytes', 'node_network_receive_bytes_total',
    'node_network_transmit_bytes_total',
    # node exporter's systemd and textfile collectors (the masters' leader gauge: mooncake_master_watchdog.py)
    'node_systemd_unit_state', 'pd_mooncake_master_leader',
    'vllm:num_requests_kv_fetch_by_stage',
    # smg 1.13.0's Prometheus port (vllm_router_implementation: smg; seen on the lab)
    'smg_router_requests_total', 'smg_pd_kv_connector_mode_total',
    # vllm-router 0.1.17's Prometheus port
    'vllm_router_pd_requests_total', 'vllm_router_processed_requests_total', 'vllm_router_pd_request_duration_seconds_bucket',
    'vllm_router_pd_pending_decode_requests', 'vllm_router_pd_active_decode_requests',
}
# Grafana's variables, replaced by what they expand to before promtool reads the query.
GRAFANA_VARS = {'$__rate_interval': '5m', '$pool': '.*', '$instance': '.*'}
PROMQL_WORDS = {'sum', 'by', 'avg', 'rate', 'increase', 'histogram_quantile', 'without', 'on', 'ignoring', 'max', 'min',
                'count', 'topk', 'and', 'or', 'unless', 'offset', 'bool'}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def queries():
    return [(p['title'], t['expr']) for p in dashboard()['panels'] for t in p.get('targets') or []]


def test_rows_and_variables():
    d = dashboard()
    assert [p['title'] for p in d['panels'] if p['type'] == 'row'] == ROWS
    names = [v['name'] for v in d['templating']['list']]
    assert {'pool', 'instance'} <= set(names)
    # Every row holds at least one panel before the next row.
    kinds = [p['type'] for p in d['panels']]
    assert all(kinds[i + 1] != 'row' for i, k in enumerate(kinds[:-1]) if k == 'row') and kinds[-1] != 'row'
    assert len({p['id'] for p in d['panels']}) == len(d['panels'])


def test_every_query_parses_in_promtool(tmp_path):
    rules = []
    for n, (title, expr) in enumerate(queries()):
        for var, value in GRAFANA_VARS.items():
            expr = expr.replace(var, value)
        assert '$' not in expr, '%s: unknown Grafana variable in %s' % (title, expr)
        rules.append({'record': 'dashboard:query_%d' % n, 'expr': expr})
    path = tmp_path / 'dashboard-queries.yml'
    path.write_text(yaml.safe_dump({'groups': [{'name': 'dashboard', 'rules': rules}]}))
    res = subprocess.run([PROMTOOL, 'check', 'rules', str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_every_series_is_a_recording_rule_or_an_exported_metric():
    records = {r['record'] for g in yaml.safe_load(render_rules())['groups'] for r in g['rules'] if 'record' in r}
    unknown = []
    for title, expr in queries():
        text = re.sub(r'\{[^}]*\}|"[^"]*"|\[[^\]]*\]', ' ', expr)  # drop matchers, strings and ranges
        text = re.sub(r'\b(by|without)\s*\([^)]*\)', ' ', text)  # and grouping labels
        for name in re.findall(r'[A-Za-z_:][A-Za-z0-9_:]*', text):
            if name in PROMQL_WORDS or name in records or name in KNOWN_METRICS:
                continue
            unknown.append('%s: %s' % (title, name))
    assert not unknown, unknown
    used = {n for _, e in queries() for n in re.findall(r'pd:[a-z0-9_:]+', e)}
    assert used <= records and used, sorted(used - records)


def row_exprs(title):
    """The queries of the panels under the dashboard row titled title (up to the next row)."""
    panels = dashboard()['panels']
    rows = [i for i, p in enumerate(panels) if p['type'] == 'row']
    start = next(i for i in rows if panels[i]['title'] == title)
    row = panels[start + 1:next(i for i in rows if i > start)]
    return [t['expr'] for p in row for t in p.get('targets') or []]


def test_the_kv_transfer_row_shows_the_prefix_cache_hit_rate_per_pool():
    """Issue 30: decode's own prefix-cache hits are the best case, shown beside the KV transfer, never alerted on."""
    exprs = row_exprs('KV transfer')
    assert 'pd:vllm_prefix_cache_hit_rate:rate5m{role=~"$pool"}' in exprs
    records = {r['record'] for g in yaml.safe_load(render_rules())['groups'] for r in g['rules'] if 'record' in r}
    assert 'pd:vllm_prefix_cache_hit_rate:rate5m' in records


def test_the_kv_transfer_row_shows_the_store_tiers():
    """The store's hits by tier (memory, SSD) and the SSD tier's used share (alert StoreSSDAboveHighWatermark)."""
    exprs = row_exprs('KV transfer')
    assert {'pd:mooncake_store_hits:rate5m', 'pd:mooncake_store_ssd_used_ratio'} <= set(exprs)


def _load_monitoring():
    import importlib.util
    spec = importlib.util.spec_from_file_location('dash_test_monitoring', REPO / 'plugins' / 'filter' / 'monitoring.py')
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_with_pools_every_vllm_and_router_query_is_per_pool(tmp_path):
    """Model pools (vllm_pools): bundle_dashboard_pools filters every query of pooled series (the vllm and router
    jobs, the vLLM recording rules) by the variable model_pool and groups it by pool; without pools the dashboard is
    the file as it is. The pooled queries still parse in promtool."""
    mon = _load_monitoring()
    assert mon.dashboard_pools(dashboard(), False) == dashboard()
    pooled = mon.dashboard_pools(dashboard(), True)
    assert [v['name'] for v in pooled['templating']['list']][:2] == ['datasource', 'model_pool']
    instance = next(v for v in pooled['templating']['list'] if v['name'] == 'instance')
    assert 'pool=~"$model_pool"' in instance['definition'] and 'pool=~"$model_pool"' in instance['query']['query']
    rules = []
    for panel in pooled['panels']:
        for n, t in enumerate(panel.get('targets') or []):
            expr = t['expr']
            reads_pooled = re.search(r'job="vllm(_router)?"|pd:(vllm|decode)_', expr)
            if reads_pooled:
                assert 'pool=~"$model_pool"' in expr and t['legendFormat'].startswith('{{pool}} '), expr
                assert 'by (' not in expr or 'by (pool, ' in expr, expr
            else:
                assert 'pool' not in expr, expr
            for var, value in dict(GRAFANA_VARS, **{'$model_pool': '.*'}).items():
                expr = expr.replace(var, value)
            rules.append({'record': 'dashboard:query_%d_%d' % (panel['id'], n), 'expr': expr})
    path = tmp_path / 'dashboard-queries.yml'
    path.write_text(yaml.safe_dump({'groups': [{'name': 'dashboard', 'rules': rules}]}))
    res = subprocess.run([PROMTOOL, 'check', 'rules', str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
