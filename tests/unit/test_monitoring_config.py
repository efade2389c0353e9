"""The monitoring role's prometheus.yml, file_sd files and alertmanager.yml (templates/monitoring/), rendered as the
role renders them for inventory/prod plus a monitoring host, with the targets of plugins/filter/monitoring.py, and
checked by the real promtool (`promtool check config`, which reads the rule files, the file_sd files and the etcd
TLS files it names) and amtool (`amtool check-config`). Also the /etc/default command lines (each on the host's
cluster address) and the render for an operator's own Prometheus (scrape_configs.yml). Fails without the tools."""
import json
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

from test_monitoring_filter import bf, mon, prod  # noqa: F401  (prod: the inventory fixture)
from test_monitoring_rules import PROMTOOL, defaults, render_rules

REPO = Path(__file__).resolve().parents[2]
AMTOOL = shutil.which('amtool') or '/usr/bin/amtool'
MON_HOST, MON_IP = 'mon-1', '10.10.9.5'


def env():
    e = jinja2.Environment(loader=jinja2.FileSystemLoader(str(REPO / 'templates')), trim_blocks=True,
                           keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    e.filters.update(to_json=json.dumps, to_nice_json=lambda v, indent=4: json.dumps(v, indent=indent, sort_keys=True),
                     to_nice_yaml=lambda v, indent=4: yaml.safe_dump(v, indent=indent, default_flow_style=False),
                     **{'pd_bundle.serving.bundle_host_ip': bf.host_ip})
    return e


@pytest.fixture()
def rendered(prod, tmp_path):  # noqa: F811
    """Every file the role writes on MON_HOST, under tmp_path (paths moved there through the role's variables)."""
    groups, hv = prod
    groups = dict(groups, monitoring=[MON_HOST])
    hv = dict(hv, **{MON_HOST: {'ansible_host': MON_IP}})
    scrape = mon.scrape_targets(groups, hv)
    v = defaults()
    v.update(monitoring_rules_dir=str(tmp_path / 'rules'), monitoring_etcd_client_dir=str(tmp_path / 'etcd'),
             inventory_hostname=MON_HOST, hostvars=hv, _monitoring_scrape=scrape,
             _monitoring_address=bf.host_ip(MON_HOST, hv), _monitoring_file_sd_dir=str(tmp_path / 'file_sd'),
             _monitoring_config=str(tmp_path / 'prometheus.yml'),
             _monitoring_alertmanager_config=str(tmp_path / 'alertmanager.yml'),
             _monitoring_alertmanagers=[t for j in scrape['alertmanager']['targets'] for t in j['targets']],
             _monitoring_unit_include=mon.unit_include(MON_HOST, groups, hv),
             _monitoring_alertmanager_storage=str(tmp_path / 'alertmanager'))
    e = env()
    for d in ('rules', 'etcd', 'file_sd'):
        (tmp_path / d).mkdir()
    for name in ('ca.crt', 'client.crt', 'client.key'):  # promtool checks that the TLS files exist
        (tmp_path / 'etcd' / name).write_text('')
    (tmp_path / 'rules' / 'pd-bundle.rules.yml').write_text(render_rules())
    for job, cfg in scrape.items():
        (tmp_path / 'file_sd' / ('%s.json' % job)).write_text(e.get_template('monitoring/file_sd.json.j2').render(
            v, _monitoring_job=cfg))
    for src, dest in (('prometheus.yml.j2', 'prometheus.yml'), ('alertmanager.yml.j2', 'alertmanager.yml'),
                      ('prometheus.default.j2', 'prometheus.default'), ('alertmanager.default.j2', 'alertmanager.default'),
                      ('node-exporter.conf.j2', 'node-exporter.conf')):
        (tmp_path / dest).write_text(e.get_template('monitoring/' + src).render(v))
    return tmp_path, scrape, v


def test_tools_are_here():
    missing = [t for t in (PROMTOOL, AMTOOL) if not Path(t).exists()]
    assert not missing, 'install prometheus and prometheus-alertmanager (scripts/install-deps.sh): %s' % missing


def test_prometheus_yml_passes_promtool_with_every_job(rendered):
    root, scrape, _ = rendered
    res = subprocess.run([PROMTOOL, 'check', 'config', str(root / 'prometheus.yml')], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    cfg = yaml.safe_load((root / 'prometheus.yml').read_text())
    jobs = {j['job_name']: j for j in cfg['scrape_configs']}
    assert set(jobs) == set(mon.JOBS)  # inventory/prod + a monitoring host: every job has targets
    assert jobs['etcd']['scheme'] == 'https' and jobs['etcd']['tls_config']['cert_file'].endswith('/etcd/client.crt')
    assert all('tls_config' not in j for n, j in jobs.items() if n != 'etcd')
    assert cfg['alerting']['alertmanagers'][0]['static_configs'][0]['targets'] == ['%s:9093' % MON_IP]
    assert cfg['rule_files'] == [str(root / 'rules') + '/*.yml']
    for job in scrape:
        assert json.loads((root / 'file_sd' / ('%s.json' % job)).read_text()) == scrape[job]['targets']


def test_a_job_without_targets_is_left_out(rendered):
    root, scrape, v = rendered
    scrape = dict(scrape, etcd=dict(scrape['etcd'], targets=[]))
    text = env().get_template('monitoring/prometheus.yml.j2').render(v, _monitoring_scrape=scrape)
    assert 'etcd' not in {j['job_name'] for j in yaml.safe_load(text)['scrape_configs']}


def test_alertmanager_yml_passes_amtool(rendered):
    root, _, _ = rendered
    res = subprocess.run([AMTOOL, 'check-config', str(root / 'alertmanager.yml')], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_daemons_listen_on_the_cluster_address(rendered):
    root, _, _ = rendered
    assert '--web.listen-address=%s:9090' % MON_IP in (root / 'prometheus.default').read_text()
    assert '--storage.tsdb.retention.time=15d' in (root / 'prometheus.default').read_text()
    am = (root / 'alertmanager.default').read_text()
    assert '--web.listen-address=%s:9093' % MON_IP in am and am.rstrip().endswith('--cluster.listen-address="')
    # node exporter: Debian's ExecStart ($ARGS from /etc/default) is replaced in the drop-in, the new one has no
    # character systemd would expand or unescape.
    lines = (root / 'node-exporter.conf').read_text().splitlines()
    execs = [line for line in lines if line.startswith('ExecStart=')]
    assert execs[0] == 'ExecStart=' and len(execs) == 2, execs
    assert execs[1].startswith('ExecStart=/usr/bin/prometheus-node-exporter --web.listen-address=%s:9100 ' % MON_IP)
    assert not set('%$\\"\'') & set(execs[1]), execs[1]


def test_export_scrape_configs_point_at_the_rendered_targets(rendered):
    root, scrape, v = rendered
    text = env().get_template('monitoring/scrape_configs.export.yml.j2').render(v, _monitoring_file_sd_dir='/srv/pd')
    jobs = yaml.safe_load(text)['scrape_configs']
    assert [j['file_sd_configs'][0]['files'] for j in jobs] == [['/srv/pd/%s.json' % n] for n in mon.JOBS]
