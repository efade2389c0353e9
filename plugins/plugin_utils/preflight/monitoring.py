"""Preflight checks of the class monitoring: the monitoring group's Prometheus, its alert thresholds and Grafana.

Unit-tested in tests/unit/test_preflight_checks.py and tests/unit/test_preflight_classes.py.
"""
import re

from .core import _option, check, refuse


# --- monitoring: the monitoring group's Prometheus, its alert thresholds and Grafana -------------------------------

PROM_DURATION_RE = r'^([0-9]+(ms|s|m|h|d|w|y))+$'
# name: (low, high, low inclusive, why)
MONITORING_RANGES = {
    'monitoring_ttft_p99_slo_seconds': (0, None, False, 'seconds, above 0'),
    'monitoring_recompute_share_max': (0, 1, True, 'a share from 0 to 1 (0.1 = 10 %)'),
    'monitoring_master_leader_changes_max': (0, None, True, 'a count, 0 or more'),
    'monitoring_store_ssd_used_ratio_max': (0, 1, False, 'a share above 0, at most 1 (the SSD tier\'s high watermark)'),
}


@check('monitoring', role='monitoring')
def monitoring_settings(cfg, host, groups, specs):
    """On a monitoring host: alert thresholds in range, Prometheus durations, absolute paths. Their types are the
    spec's; the ports' collisions are ports_conflicts' (PORT_VARS, bundle_host_listeners)."""
    out = []
    for var, (low, high, low_ok, why) in MONITORING_RANGES.items():
        v = cfg.get(var)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue  # the spec refuses another type
        if v < low or (v == low and not low_ok) or (high is not None and v > high):
            out.append(refuse(var, host, 'is out of range', '%s (default %s).'
                              % (why, _option(specs, var, 'monitoring').get('default')), value=v))
    for var in ('monitoring_scrape_interval', 'monitoring_retention', 'monitoring_down_for'):
        v = cfg.get(var)
        if isinstance(v, str) and not re.match(PROM_DURATION_RE, v):
            out.append(refuse(var, host, 'is not a Prometheus duration', 'e.g. %s (digits and a unit: ms, s, m, h, d, '
                              'w, y).' % _option(specs, var, 'monitoring').get('default'), value=v))
    for var in ('monitoring_rules_dir', 'monitoring_node_exporter_textfile_dir'):  # the etcd client dir: TLS_PATHS
        v = cfg.get(var)
        if isinstance(v, str) and not v.startswith('/'):
            out.append(refuse(var, host, 'is not an absolute path', 'e.g. %s.'
                              % _option(specs, var, 'monitoring').get('default'), value=v))
    return out


@check('monitoring', role='monitoring')
def monitoring_grafana(cfg, host, groups, specs):
    """A Grafana to provision: an http(s) URL, and a token only with a URL (a token alone would be silently unused)."""
    url, token = cfg.get('monitoring_grafana_url') or '', cfg.get('monitoring_grafana_token') or ''
    if not isinstance(url, str) or not isinstance(token, str):
        return []
    if url and not re.match(r'^https?://[^/\s]+', url):
        return [refuse('monitoring_grafana_url', host, 'is not an http(s) URL', 'your Grafana\'s base URL, e.g. '
                       'https://grafana.example.com (or "" for none).', value=url)]
    if token and not url:
        return [refuse('monitoring_grafana_token', host, 'monitoring_grafana_token is set on %s (value not shown) but '
                       'monitoring_grafana_url is empty: the dashboard would not be provisioned' % host,
                       'set monitoring_grafana_url, or remove the token.', whole=True)]

    return []
