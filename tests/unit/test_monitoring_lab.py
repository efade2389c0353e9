"""scripts/lab/monitoring-test.py, the lab's monitoring step: which expressions it queries, and that each of its
goals fails when missed (an empty expression, a late or missing alert, a target down)."""
import importlib.util
import json
from pathlib import Path

import pytest

from test_monitoring_rules import render_rules

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location('monitoring_lab', REPO / 'scripts' / 'lab' / 'monitoring-test.py')
ml = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ml)


@pytest.mark.parametrize('expr,want', [
    ('up == 0', 'up'),
    ('sum(changes(pd_mooncake_master_leader{job="node"}[10m])) / 2 > 2', 'sum(changes(pd_mooncake_master_leader{job="node"}[10m])) / 2'),
    ('pd:decode_recompute_share:rate5m > 0.1', 'pd:decode_recompute_share:rate5m'),
    ('histogram_quantile(0.99, rate(x_bucket[5m])) > 0.5', 'histogram_quantile(0.99, rate(x_bucket[5m]))'),
    ('sum by (role) (rate(x[5m]))', 'sum by (role) (rate(x[5m]))'),  # no comparison: as is
])
def test_an_alert_is_queried_without_its_threshold(expr, want):
    assert ml.without_threshold(expr) == want


def test_every_rule_and_panel_is_queried_with_grafana_variables_replaced():
    dashboard = json.loads(ml.DASHBOARD.read_text())
    exprs = ml.expressions(render_rules(), dashboard)
    wheres = [w for w, _ in exprs]
    assert {'alert UnitDown', 'alert RecomputeRising', 'record pd:vllm_prefix_cache_hit_rate:rate5m'} <= set(wheres)
    assert 'panel Prefix-cache hit rate per pool [A]' in wheres
    assert sum(1 for w in wheres if w.startswith('panel ')) == sum(len(p.get('targets') or []) for p in dashboard['panels'])
    assert not [e for _, e in exprs if '$' in e]
    assert dict(exprs)['alert TargetDown'] == 'up'


def test_an_expression_without_series_fails():
    results = [(('record a', 'a'), 3), (('alert B', 'b'), 0), (('panel C [A]', 'c'), 'parse error')]
    assert ml.empty_ones(results) == ['alert B: b -> no series', 'panel C [A]: c -> parse error']
    assert ml.empty_ones(results[:1]) == []


def test_the_load_goal_fails_on_any_failed_request():
    """Every request of the load must succeed: one success among failures (the old check) fails, and so does one
    failure among many successes; the failures are named."""
    spec = importlib.util.spec_from_file_location('lab_load', REPO / 'scripts' / 'lab' / 'load.py')
    load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(load)

    def summary(*oks):
        return load.summarize([{'t': 1.5 * i, 'latency': 0.4, 'ok': ok, 'error': '' if ok else 'HTTP 503: b\'no server\''}
                               for i, ok in enumerate(oks)])
    assert ml.load_problems(summary(*[True] * 20)) == []
    one_success = ml.load_problems(summary(True, False, False))
    assert one_success == ['2 of 3 requests of the load through the entry failed; every one must succeed',
                           "load request at 1.5 s failed: HTTP 503: b'no server'",
                           "load request at 3.0 s failed: HTTP 503: b'no server'"]
    one_failure = ml.load_problems(summary(*[True] * 19 + [False]))
    assert one_failure[0] == '1 of 20 requests of the load through the entry failed; every one must succeed'
    many = ml.load_problems(summary(*[False] * 8), shown=5)
    assert len(many) == 7 and many[-1] == 'and 3 more failed requests (results: load.failures)'
    assert ml.load_problems(summary()) == ['the load sent no request through the entry']


def test_a_pending_or_firing_alert_on_the_healthy_lab_fails():
    """Under the load with repeated prompts no rule may even be pending (issue 30: KVTransferShareLow went pending on
    decode's own prefix-cache hits)."""
    assert ml.quiet_problems([]) == []
    assert ml.quiet_problems([{'labels': {'alertname': 'X'}, 'state': 'inactive'}]) == []
    pending = {'labels': {'alertname': 'KVTransferShareLow', 'severity': 'warning'}, 'state': 'pending'}
    assert ml.quiet_problems([pending]) == [
        'alert KVTransferShareLow is pending on a healthy lab under load with repeated prompts (severity=warning)']
    assert 'is firing' in ml.quiet_problems([dict(pending, state='firing')])[0]


def test_the_alert_goal_fails_late_or_missing():
    assert ml.alert_problems(41.0, 55) == []
    assert ml.alert_problems(56.2, 55) == ['UnitDown fired 56.2 s after the unit stopped, over the bound of 55 s']
    assert ml.alert_problems(None, 55) == ['UnitDown did not fire within 55 s of the unit stopping']


def test_down_targets_and_durations():
    targets = [{'labels': {'job': 'node', 'instance': 'etcd1'}, 'health': 'up'},
               {'labels': {'job': 'etcd', 'instance': 'etcd2'}, 'health': 'down', 'lastError': 'connection refused'}]
    assert ml.down_targets(targets) == ['etcd etcd2: connection refused']
    assert [ml.seconds(d) for d in ('10s', '1m', '1m30s', '500ms')] == [10, 60, 90, 0.5]
    with pytest.raises(ValueError):
        ml.seconds('1 minute')


def test_the_report_fails_on_a_panel_without_data(tmp_path):
    """scripts/bench/plot_monitoring.py (playbooks/report.yml's PNG): NaN points dropped, a panel with no point
    named, exit 1; with data in every panel, a PNG and exit 0."""
    spec = importlib.util.spec_from_file_location('plot_monitoring', REPO / 'scripts' / 'bench' / 'plot_monitoring.py')
    pm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pm)

    def res(*series):
        return {'status': 'success', 'data': {'result': [{'metric': {'role': r}, 'values': v} for r, v in series]}}
    queries = [[{'panel': 'TTFT (s)', 'name': 'p99', 'expr': 'a'}, res(('decode', [[0, '0.5'], [15, '0.7']]))],
               [{'panel': 'requests/s', 'name': '', 'expr': 'b'}, res(('prefill', [[0, 'NaN']]))]]
    by = pm.panels(queries)
    assert by['TTFT (s)'] == [('decode p99', [(0.0, 0.5), (15.0, 0.7)])] and pm.empty_panels(by) == ['requests/s']
    src = tmp_path / 'r.json'
    src.write_text(json.dumps(queries))
    assert pm.main(['x', str(src), str(tmp_path / 'r.png'), '5']) == 1
    queries[1][1] = res(('prefill', [[0, '1.5']]))
    src.write_text(json.dumps(queries))
    assert pm.main(['x', str(src), str(tmp_path / 'r.png'), '5']) == 0 and (tmp_path / 'r.png').stat().st_size > 1000


def test_a_pending_ttft_alert_is_excused_only_by_a_recomputed_pull_within_the_bound():
    """The lab's 30 s Mooncake TCP stall (docs/tcp-stall.md) makes one request the p99 of a minute's load: with that
    recompute in a decode journal TTFTP99AboveSLO is explained; without one it fails, and so do more recomputes than
    the bound, and any other alert."""
    ttft = {'labels': {'alertname': 'TTFTP99AboveSLO', 'role': 'decode'}, 'state': 'pending'}
    other = {'labels': {'alertname': 'KVTransferShareLow'}, 'state': 'pending'}
    pull = 'decode1: ... pulling kv_caches for [cmpl-1] failed: Mooncake transfer engine returned -1'
    assert ml.quiet_problems([ttft]) == [
        'alert TTFTP99AboveSLO is pending on a healthy lab under load with repeated prompts (role=decode)']
    assert ml.quiet_problems([ttft], [pull]) == []
    assert ml.quiet_problems([ttft, other], [pull]) == [
        'alert KVTransferShareLow is pending on a healthy lab under load with repeated prompts ()']
    too_many = ml.quiet_problems([ttft], [pull] * (ml.MAX_RECOMPUTED + 1))
    assert len(too_many) == 1 and too_many[0].startswith('%d KV pulls recomputed on decode during the load (bound %d)'
                                                         % (ml.MAX_RECOMPUTED + 1, ml.MAX_RECOMPUTED))
