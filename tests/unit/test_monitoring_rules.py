"""The monitoring role's recording rules and alerts (templates/monitoring/rules.yml.j2), rendered with the role's
defaults as Ansible renders it, checked by the real promtool (`promtool check rules`) and unit-tested by it
(`promtool test rules tests/monitoring/rules_test.yml`: each alert fires on its firing case and stays quiet on its
quiet one). An alert without both cases there fails, as does a runbook without its row in README.md, a threshold
that does not reach the expression, and a machine without promtool (scripts/install-deps.sh installs it): these
tests never skip. A default that is a template over the inventory (monitoring_store_ssd_used_ratio_max) is rendered
with the bundle's filters, for an inventory without SSD hosts unless a test gives one."""
import copy
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RULES_TEST = REPO / 'tests' / 'monitoring' / 'rules_test.yml'
# The same rules rendered with model pools (vllm_pools): the pool label kept and named.
RULES_POOLS_TEST = REPO / 'tests' / 'monitoring' / 'rules_pools_test.yml'
PROMTOOL = shutil.which('promtool') or '/usr/bin/promtool'


_spec = importlib.util.spec_from_file_location('mon_rules_bundle', REPO / 'plugins' / 'filter' / 'bundle.py')
bf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bf)


def defaults(groups=None, hostvars=None):
    """The role's defaults; the templated ones rendered as Ansible renders them for the inventory (groups, hostvars)."""
    v = yaml.safe_load((REPO / 'roles' / 'monitoring' / 'defaults' / 'main.yml').read_text())
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update({'pd_bundle.serving.bundle_store_ssd_hosts': bf.store_ssd_hosts,
                        'pd_bundle.serving.bundle_host_cfg': bf.host_cfg})
    for key, value in v.items():
        if isinstance(value, str) and ('{{' in value or '{%' in value):
            v[key] = yaml.safe_load(env.from_string(value).render(groups=groups or {}, hostvars=hostvars or {}))
    return v


def render_rules(**overrides):
    """rules.yml as the role writes it (Ansible's template: trim_blocks), from its defaults and overrides, for a fleet
    with SSD hosts at the vllm role's default high watermark (rules_test.yml's StoreSSDAboveHighWatermark cases)."""
    v = defaults()
    vllm = yaml.safe_load((REPO / 'roles' / 'vllm' / 'defaults' / 'main.yml').read_text())
    v['monitoring_store_ssd_used_ratio_max'] = vllm['vllm_store_ssd_high_watermark']
    # roles/monitoring/vars/main.yml: an inventory without vllm_pools unless a test gives them.
    v['_monitoring_pooled'] = False
    v.update(overrides)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), trim_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    return env.get_template('monitoring/rules.yml.j2').render(v)


def promtool(*args, cwd=None):
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def write_case(tmp_path, rules_text):
    (tmp_path / 'pd-bundle.rules.yml').write_text(rules_text)
    shutil.copy(RULES_TEST, tmp_path / 'rules_test.yml')
    return tmp_path


def alerts(rules_text):
    return [r for g in yaml.safe_load(rules_text)['groups'] for r in g['rules'] if 'alert' in r]


def test_promtool_is_here():
    assert Path(PROMTOOL).exists(), 'promtool is missing: install prometheus (scripts/install-deps.sh)'


def test_rules_pass_promtool_check(tmp_path):
    path = tmp_path / 'pd-bundle.rules.yml'
    path.write_text(render_rules())
    res = promtool('check', 'rules', str(path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_alerts_fire_and_stay_quiet_as_tested(tmp_path):
    res = promtool('test', 'rules', 'rules_test.yml', cwd=write_case(tmp_path, render_rules()))
    assert res.returncode == 0, res.stdout + res.stderr


def test_with_pools_the_rules_keep_and_name_the_pool(tmp_path):
    text = render_rules(_monitoring_pooled=True)
    (tmp_path / 'pd-bundle.rules.yml').write_text(text)
    res = promtool('check', 'rules', str(tmp_path / 'pd-bundle.rules.yml'))
    assert res.returncode == 0, res.stdout + res.stderr
    shutil.copy(RULES_POOLS_TEST, tmp_path / 'rules_pools_test.yml')
    res = promtool('test', 'rules', 'rules_pools_test.yml', cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    # Every vLLM aggregation groups by pool; the masters' (shared by the pools) do not.
    exprs = [r['expr'] for g in yaml.safe_load(text)['groups'] for r in g['rules'] if 'record' in r]
    assert all('by (pool' in e for e in exprs if 'job="vllm"' in e)
    assert not any('pool' in e for e in exprs if 'job="mooncake_master"' in e)
    assert 'by (pool' not in render_rules() and '$labels.pool' not in render_rules()


def test_every_alert_has_a_firing_and_a_quiet_case():
    tests = yaml.safe_load(RULES_TEST.read_text())['tests']
    cases = [c for t in tests for c in t.get('alert_rule_test') or []]
    names = [a['alert'] for a in alerts(render_rules())]
    assert len(names) == len(set(names))
    assert set(names) >= {'TargetDown', 'MasterLeaderFlapping', 'RecomputeRising', 'EtcdNoLeader', 'EtcdFsyncSlow',
                          'TTFTP99AboveSLO', 'StoreSSDAboveHighWatermark'}
    missing = []
    for name in names:
        mine = [c for c in cases if c['alertname'] == name]
        if not any(c.get('exp_alerts') for c in mine):
            missing.append('%s has no firing case' % name)
        if not any(not c.get('exp_alerts') for c in mine):
            missing.append('%s has no quiet case' % name)
    unknown = sorted({c['alertname'] for c in cases} - set(names))
    assert not missing and not unknown, 'tests/monitoring/rules_test.yml: %s' % '; '.join(missing + unknown)


def test_every_alert_has_a_runbook_row_in_the_troubleshooting_doc():
    readme = (REPO / 'docs' / 'troubleshooting.md').read_text()
    for a in alerts(render_rules()):
        runbook = a['annotations'].get('runbook', '')
        assert runbook == 'docs/troubleshooting.md#alert-%s' % a['alert'].lower(), a['alert']
        assert '<a id="alert-%s"></a>' % a['alert'].lower() in readme, '%s: no anchor in docs/troubleshooting.md' % runbook
        assert {'summary', 'description'} <= set(a['annotations']) and a['labels'].get('severity'), a['alert']


@pytest.mark.parametrize('var,value,alert', [
    ('monitoring_ttft_p99_slo_seconds', 10.0, 'TTFTP99AboveSLO'),
    ('monitoring_recompute_share_max', 0.3, 'RecomputeRising'),
    ('monitoring_master_leader_changes_max', 6, 'MasterLeaderFlapping'),
    ('monitoring_store_ssd_used_ratio_max', 0.97, 'StoreSSDAboveHighWatermark'),
])
def test_thresholds_come_from_the_role_variables(tmp_path, var, value, alert):
    """The firing case of rules_test.yml stops firing when its threshold moves past it: the variable reaches the rule."""
    text = render_rules(**{var: value})
    assert str(value) in next(a['expr'] for a in alerts(text) if a['alert'] == alert)
    res = promtool('test', 'rules', 'rules_test.yml', cwd=write_case(tmp_path, text))
    assert res.returncode != 0 and alert in res.stdout + res.stderr, res.stdout + res.stderr


def test_grafana_url_adds_a_dashboard_link_to_every_alert(tmp_path):
    text = render_rules(monitoring_grafana_url='https://grafana.example.com/')
    assert all(a['annotations']['dashboard'] == 'https://grafana.example.com/d/pd-bundle' for a in alerts(text))
    assert not any('dashboard' in a['annotations'] for a in alerts(render_rules()))
    path = tmp_path / 'pd-bundle.rules.yml'
    path.write_text(text)
    res = promtool('check', 'rules', str(path))
    assert res.returncode == 0, res.stdout + res.stderr


def test_recording_rules_read_the_vllm_metrics_vllm_exports():
    """vLLM's own names (vllm/v1/metrics/loggers.py); the role label is the scrape target's (plugins/filter/monitoring.py)."""
    exprs = ' '.join(r['expr'] for g in yaml.safe_load(render_rules())['groups'] for r in g['rules'] if 'record' in r)
    for metric in ('vllm:time_to_first_token_seconds_bucket', 'vllm:inter_token_latency_seconds_bucket',
                   'vllm:prompt_tokens_by_source_total', 'vllm:num_requests_running', 'vllm:num_requests_waiting',
                   'vllm:request_success_total', 'vllm:prefix_cache_hits_total', 'vllm:prefix_cache_queries_total'):
        assert metric in exprs, metric
    assert set(re.findall(r'source=~?"([\w|]+)"', exprs)) == {'external_kv_transfer', 'local_compute',
                                                               'local_compute|external_kv_transfer'}


def test_no_alert_watches_a_share_that_prefix_cache_hits_lower():
    """Issue 30: decode's KV-transfer share falls when decode finds prompts in its own prefix cache (local_cache_hit),
    the best case. Alerts mean a fault: only the recompute share (cache hits on neither side) is alerted on."""
    text = render_rules()
    exprs = ' '.join(a['expr'] for a in alerts(text))
    assert 'pd:decode_kv_transfer_share' not in exprs and 'local_cache_hit' not in exprs
    recompute = next(r['expr'] for g in yaml.safe_load(text)['groups'] for r in g['rules']
                     if r.get('record') == 'pd:decode_recompute_share:rate5m')
    assert 'local_cache_hit' not in recompute and 'source=~"local_compute|external_kv_transfer"' in recompute
    assert 'monitoring_kv_transfer_share_min' not in defaults()


def test_store_ssd_threshold_is_the_ssd_hosts_high_watermark(prod_inventory):
    """One fact, one place: StoreSSDAboveHighWatermark's default threshold is the SSD hosts' (bundle_store_ssd_hosts)
    vllm_store_ssd_high_watermark, the highest of them, read from their settings; 1.0 without SSD hosts."""
    groups, hv = prod_inventory
    ssd = bf.store_ssd_hosts(groups, hv)
    assert ssd == groups['vllm_prefill']  # inventory/prod runs the SSD tier on every prefill host
    mark = bf.host_cfg(ssd[0], hv)['vllm_store_ssd_high_watermark']  # the vllm role's default there
    assert defaults(groups, hv)['monitoring_store_ssd_used_ratio_max'] == mark
    hv = copy.deepcopy(hv)
    hv['gpu-p2']['vllm_store_ssd_high_watermark'] = 0.95
    hv['gpu-d1']['vllm_store_ssd_high_watermark'] = 0.99  # not an SSD host: not read
    assert defaults(groups, hv)['monitoring_store_ssd_used_ratio_max'] == 0.95
    expr = next(a['expr'] for a in alerts(render_rules(**defaults(groups, hv))) if a['alert'] == 'StoreSSDAboveHighWatermark')
    assert expr == 'pd:mooncake_store_ssd_used_ratio > 0.95'
    for h in ssd:
        hv[h]['vllm_store_ssd'] = False
    assert defaults(groups, hv)['monitoring_store_ssd_used_ratio_max'] == 1.0


def test_store_rules_read_the_masters_counters_with_max():
    """With HA masters only the leader's counters and gauges move: every store rule takes the max over the masters."""
    rules = {(r['record'], (r.get('labels') or {}).get('tier')): r['expr']
             for g in yaml.safe_load(render_rules())['groups'] for r in g['rules'] if 'record' in r}
    assert rules[('pd:mooncake_store_hits:rate5m', 'memory')] == 'max(rate(mem_cache_hit_nums_{job="mooncake_master"}[5m]))'
    assert rules[('pd:mooncake_store_hits:rate5m', 'ssd')] == 'max(rate(file_cache_hit_nums_{job="mooncake_master"}[5m]))'
    ratio = rules[('pd:mooncake_store_ssd_used_ratio', None)]
    assert ratio.startswith('max(master_allocated_file_size_bytes{') and '(max(master_total_file_capacity_bytes{' in ratio
