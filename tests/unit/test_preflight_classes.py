"""The wrong inventories that used to pass preflight, render and break on the hosts, by class (the check
functions called directly: the end-to-end cases of tests/preflight keep one per class):

1. pd_consistency: prefill and decode disagree on what KV shape and request length depend on
2. managed:        the escape hatches (extra args, extra env, store config) repeat a managed name
3. values:         values the services reject or ignore (vLLM, etcd, pip, systemd rules as data)
4. sandbox:        paths the hardened units hide or make read-only
5. addresses:      cluster members without a distinct, usable address; an address other hosts must reach that is
                   loopback, a wildcard where it is advertised, or has a port suffix (REACHABLE)
6. tls:            a path TLS uses left empty or relative while that TLS is on (TLS_PATHS)

Each refused case names the variable, the host (or host/instance) and the fix; each class has legal
variations that pass.
"""
import copy
import importlib.util
import os

import pytest

from test_preflight_checks import ENTRY_GROUPS, GROUPS, INVENTORY, MON_GROUPS, REPO, SPECS, fleet, pc

GOOD_FLEET = INVENTORY


def inv_with(changes):
    """INVENTORY with {host: {var: value}} set; 'vllm_instances.N.key' paths set an instance's key."""
    inv = copy.deepcopy(INVENTORY)
    for host, values in changes.items():
        inv.setdefault(host, {})
        for var, value in values.items():
            if var.startswith('vllm_instances.'):
                _, idx, key = var.split('.', 2)
                inv[host]['vllm_instances'][int(idx)][key] = value
            else:
                inv[host][var] = value
    return inv


def run_class(skip_class, inv, groups=None):
    """Every message of the checks of one preflight_skip class, fleet and per host."""
    groups = groups or GROUPS
    hv = fleet(inv)
    ids = {c['id'] for c in pc.CHECKS if c['skip'] == skip_class}
    assert ids, skip_class
    out = []
    for c in pc.CHECKS:
        if c['id'] not in ids:
            continue
        if c['scope'] == 'fleet':
            out += c['fn'](hv, 'ctl-1', groups, SPECS)
        else:
            out += [m for h in hv if '_preflight_cfg' in hv[h] and pc.applies(c, hv[h]['_preflight_cfg'], h, groups)
                    for m in c['fn'](hv[h]['_preflight_cfg'], h, groups, SPECS)]
    return out


def assert_refused(skip_class, changes, expected, groups=None):
    msgs = run_class(skip_class, inv_with(changes), groups)
    text = ' '.join(msgs)
    assert msgs, 'class %s accepted %s' % (skip_class, changes)
    for sub in expected + ['Fix:']:
        assert sub in text, 'missing %r in %s' % (sub, text)


def assert_passes(skip_class, changes, groups=None):
    assert run_class(skip_class, inv_with(changes), groups) == []


SECOND_DECODE_POOL = {
    'groups': dict(GROUPS, vllm_decode=['gpu-d1', 'gpu-d2']),
    'gpu-d2': {'ansible_host': '10.0.1.32', 'vllm_model': '/srv/models/m', 'vllm_host_gpu_count': 4,
               'vllm_instances': [{'name': 'decode0', 'port': 8200, 'gpus': [0, 1, 2, 3], 'tensor_parallel_size': 4,
                                   'extra_args': ['--max-num-seqs', '64']}]},
}


# --- class 1: prefill/decode consistency -------------------------------------------------------------

PD_REFUSED = {
    'served_name_on_decode': ({'gpu-d1': {'vllm_served_model_name': 'qwen-decode'}},
                              ['--served-model-name', '"m" on prefill gpu-p1/prefill0', '"qwen-decode" on decode gpu-d1/decode0',
                               'vllm_served_model_name once']),
    'model_on_decode': ({'gpu-d1': {'vllm_model': '/srv/models/other'}},
                        ['--model', '"/srv/models/other" on decode gpu-d1/decode0', 'Fix: set vllm_model once']),
    'block_size_per_instance': ({'gpu-d1': {'vllm_instances.0.extra_args': ['--block-size', '32']}},
                                ['--block-size', 'unset (vLLM\'s default) on prefill gpu-p1/prefill0',
                                 '"32" on decode gpu-d1/decode0 (from vllm_instances[decode0].extra_args)']),
    'block_size_on_one_prefill': ({'gpu-p1': {'vllm_instances.1.extra_args': ['--block_size=64']},
                                   'gpu-d1': {'vllm_extra_args': ['--block-size', '16']}},
                                  ['--block-size', 'gpu-p1/prefill1 (from vllm_instances[prefill1].extra_args)',
                                   'gpu-d1/decode0 (from vllm_extra_args)']),
    'kv_cache_dtype': ({'gpu-p1': {'vllm_extra_args': ['--kv-cache-dtype', 'fp8']},
                        'gpu-d1': {'vllm_extra_args': ['--kv-cache-dtype=fp8_e5m2']}},
                       ['--kv-cache-dtype', '"fp8" on prefill', '"fp8_e5m2" on decode']),
    'dtype': ({'gpu-d1': {'vllm_extra_args': ['--dtype', 'bfloat16']}}, ['--dtype', '"bfloat16" on decode gpu-d1/decode0']),
    'max_model_len_vs_extra_arg': ({'gpu-p1': {'vllm_max_model_len': 32768},
                                    'gpu-d1': {'vllm_extra_args': ['--max-model-len', '16k']}},
                                   ['--max-model-len', '"32768" on prefill', 'gpu-p1/prefill0, gpu-p1/prefill1 (from vllm_max_model_len)',
                                    '"16k" on decode gpu-d1/decode0 (from vllm_extra_args)']),
    'max_model_len_per_group': ({'gpu-d1': {'vllm_max_model_len': 8192}},
                                ['--max-model-len', 'unset (vLLM\'s default) on prefill', '"8192" on decode gpu-d1/decode0']),
    'revision': ({'gpu-p1': {'vllm_extra_args': ['--revision', 'abc123']}}, ['--revision', '"abc123" on prefill']),
    'pipeline_stages': ({'gpu-d1': {'vllm_extra_args': ['-pp', '2']}}, ['--pipeline-parallel-size', '"2" on decode']),
}


@pytest.mark.parametrize('case', sorted(PD_REFUSED))
def test_pd_consistency_refuses(case):
    changes, expected = PD_REFUSED[case]
    assert_refused('pd_consistency', changes, expected)


def test_pd_tp_layout_refuses_sizes_that_do_not_divide():
    inv = inv_with({'gpu-d1': {'vllm_instances': [{'name': 'decode0', 'port': 8200, 'gpus': [0, 1, 2],
                                                   'tensor_parallel_size': 3}]}})
    msgs = pc.fleet.pd_tp_layout(fleet(inv), 'ctl-1', GROUPS, SPECS)
    assert len(msgs) == 1  # prefill0 (4) and prefill1 (4 GPUs) x decode0 (3): one message per size pair
    for sub in ['prefill gpu-p1/prefill0 (vllm_instances[prefill0].tensor_parallel_size=4)',
                'decode gpu-d1/decode0 (vllm_instances[decode0].tensor_parallel_size=3)', 'and 1 more pairs', 'Fix:']:
        assert sub in msgs[0]


def test_pd_tp_layout_reads_the_extra_args_too():
    inv = inv_with({'gpu-d1': {'vllm_instances.0.extra_args': ['-tp', '3']}})
    msgs = pc.fleet.pd_tp_layout(fleet(inv), 'ctl-1', GROUPS, SPECS)
    assert msgs and 'decode gpu-d1/decode0 (vllm_instances[decode0].extra_args=3)' in msgs[0]


PD_LEGAL = {
    'same_values_spelled_differently': {'gpu-p1': {'vllm_extra_args': ['--dtype', 'half', '--kv-cache-dtype', 'fp8',
                                                                       '--max-model-len', '32K']},
                                        'gpu-d1': {'vllm_extra_args': ['--dtype=float16', '--kv-cache-dtype', 'fp8_e4m3'],
                                                   'vllm_max_model_len': 32768}},
    'default_spelled_out': {'gpu-d1': {'vllm_extra_args': ['--dtype', 'auto', '--pipeline-parallel-size', '1']}},
    'served_name_default_equals_the_set_one': {'gpu-d1': {'vllm_served_model_name': 'm'}},
    'model_path_with_trailing_slash': {'gpu-d1': {'vllm_model': '/srv/models/m/', 'vllm_served_model_name': 'm'}},
    'decode_only_flag_that_is_not_kv': {'gpu-d1': {'vllm_instances.0.extra_args': ['--max-num-seqs', '64']}},
}


@pytest.mark.parametrize('case', sorted(PD_LEGAL))
def test_pd_consistency_legal(case):
    assert_passes('pd_consistency', PD_LEGAL[case])


def test_second_decode_pool_by_inventory_only_passes_every_check():
    inv = inv_with({'gpu-d2': SECOND_DECODE_POOL['gpu-d2']})
    groups = SECOND_DECODE_POOL['groups']
    hv = fleet(inv)
    assert pc.fleet_errors(hv, groups, SPECS, [], 'ctl-1') == []
    for h in hv:
        assert pc.host_errors(hv[h]['_preflight_cfg'], h, groups, SPECS, []) == []


# --- class 2: managed settings -----------------------------------------------------------------------

MANAGED_REFUSED = {
    'port_in_extra_args': ({'gpu-d1': {'vllm_extra_args': ['--port', '9000']}},
                           ['vllm_extra_args on gpu-d1 repeats --port', 'set vllm_instances[].port instead']),
    'served_name_underscore_form': ({'gpu-p1': {'vllm_instances.1.extra_args': ['--served_model_name=x']}},
                                    ['vllm_instances[prefill1].extra_args on gpu-p1 repeats --served-model-name',
                                     'set vllm_served_model_name instead']),
    'tp_alias': ({'gpu-p1': {'vllm_instances.0.extra_args': ['-tp', '2']}},
                 ['vllm_instances[prefill0].extra_args on gpu-p1 repeats --tensor-parallel-size']),
    'kv_transfer_config': ({'gpu-d1': {'vllm_extra_args': ['--kv-transfer-config', '{}']}},
                           ['repeats --kv-transfer-config', 'vllm_kv_connector']),
    'max_model_len_in_extra_args': ({'gpu-d1': {'vllm_extra_args': ['--max-model-len=4096']},
                                     'gpu-p1': {'vllm_extra_args': ['--max-model-len=4096']}},
                                    ['repeats --max-model-len', 'set vllm_max_model_len instead']),
    'vllm_env_host_ip': ({'gpu-d1': {'vllm_env': {'VLLM_HOST_IP': '10.0.1.99'}}},
                         ['vllm_env on gpu-d1 sets VLLM_HOST_IP', 'common_host_ip / vllm_instances[].host_ip']),
    'instance_env_gpus': ({'gpu-p1': {'vllm_instances.0.env': {'CUDA_VISIBLE_DEVICES': '0'}}},
                          ['vllm_instances[prefill0].env on gpu-p1 sets CUDA_VISIBLE_DEVICES', 'vllm_instances[].gpus']),
    'mooncake_env_nics': ({'gpu-p1': {'mooncake_env': {'MC_TE_FILTERS': 'mlx5_0'}}},
                          ['mooncake_env on gpu-p1 sets MC_TE_FILTERS']),
    'env_hf_home': ({'gpu-d1': {'vllm_env': {'HF_HOME': '/data/hf'}}}, ['vllm_env on gpu-d1 sets HF_HOME', 'vllm_hf_home']),
    'store_config_protocol': ({'gpu-d1': {'vllm_mooncake_store_config': {'global_segment_size': '4gb',
                                                                         'protocol': 'tcp'}}},
                              ['vllm_mooncake_store_config.protocol on gpu-d1', 'mooncake_protocol']),
    'router_extra_worker': ({'router-1': {'vllm_router_extra_args': ['--decode', 'http://10.0.1.99:8200']}},
                            ['vllm_router_extra_args on router-1 repeats --decode', 'add the instance to the inventory']),
    'router_extra_worker_vllm_router': ({'router-1': {'vllm_router_implementation': 'vllm-router',
                                                      'vllm_router_extra_args': ['--prefill', 'http://10.0.1.99:8100']}},
                                        ['vllm_router_extra_args on router-1 repeats --prefill', 'add the instance']),
    'router_extra_worker_urls': ({'router-1': {'vllm_router_extra_args': ['--worker-urls=http://10.0.1.99:8200']}},
                                 ['vllm_router_extra_args on router-1 repeats --worker-urls', 'add the instance']),
    'router_port': ({'router-1': {'vllm_router_extra_args': ['--port=9000']}},
                    ['vllm_router_extra_args on router-1 repeats --port', 'set vllm_router_port instead']),
    'master_ha_flag': ({'ctl-1': {'mooncake_master_extra_args': ['--enable_ha=false']}},
                       ['mooncake_master_extra_args on ctl-1 repeats --enable_ha']),
    'etcd_env_cluster': ({'ctl-1': {'etcd_extra_env': {'ETCD_INITIAL_CLUSTER': 'ctl-1=http://10.0.0.11:2380'}}},
                         ['etcd_extra_env on ctl-1 sets ETCD_INITIAL_CLUSTER']),
}


@pytest.mark.parametrize('case', sorted(MANAGED_REFUSED))
def test_managed_refuses(case):
    changes, expected = MANAGED_REFUSED[case]
    assert_refused('managed', changes, expected)


MANAGED_LEGAL = {
    'unmanaged_flag_per_instance': {'gpu-d1': {'vllm_instances.0.extra_args': ['--max-num-seqs', '64']}},
    'appending_flag': {'gpu-d1': {'vllm_extra_args': ['--middleware', 'my.Middleware']}},
    'unmanaged_env': {'gpu-d1': {'vllm_env': {'NCCL_DEBUG': 'INFO'}, 'mooncake_env': {'MC_LOG_LEVEL': 'WARNING'}}},
    'store_config_extra_field': {'gpu-d1': {'vllm_mooncake_store_config': {'global_segment_size': '4gb',
                                                                           'local_buffer_size': '1gb',
                                                                           'transfer_timeout': 5}}},
    'router_unmanaged_flag': {'router-1': {'vllm_router_extra_args': ['--log-level', 'debug']}},
    'master_unmanaged_flag': {'ctl-1': {'mooncake_master_extra_args': ['--max_threads=8']}},
    'etcd_unmanaged_env': {'ctl-1': {'etcd_extra_env': {'ETCD_LOG_LEVEL': 'warn'}}},
    'value_that_looks_like_a_flag_name': {'gpu-d1': {'vllm_extra_args': ['--override-generation-config',
                                                                         '{"port":1}']}},
}


@pytest.mark.parametrize('case', sorted(MANAGED_LEGAL))
def test_managed_legal(case):
    assert_passes('managed', MANAGED_LEGAL[case])


def test_readme_lists_every_new_class():
    readme = open(os.path.join(REPO, 'roles', 'preflight', 'README.md')).read()
    for cls in ('pd_consistency', 'managed', 'values', 'sandbox', 'addresses', 'tls'):
        if any(c['skip'] == cls for c in pc.CHECKS):
            assert '`%s`' % cls in readme


# --- class 3: values the services refuse or ignore ---------------------------------------------------

VALUES_REFUSED = {
    'gpu_memory_fraction': ({'gpu-d1': {'vllm_extra_args': ['--gpu-memory-utilization', '1.2']}},
                            ['vllm_extra_args on gpu-d1: --gpu-memory-utilization "1.2" must be at most 1']),
    'block_size_choice': ({'gpu-p1': {'vllm_instances.0.extra_args': ['--block-size=24']}},
                          ['vllm_instances[prefill0].extra_args on gpu-p1: --block-size "24" is not one of']),
    'flag_without_value': ({'gpu-p1': {'vllm_extra_args': ['--kv-cache-dtype']}},
                           ['vllm_extra_args on gpu-p1: --kv-cache-dtype has no value']),
    'connector_timeout_zero': ({'gpu-d1': {'vllm_mooncake_connector_timeout': 0}},
                               ['vllm_mooncake_connector_timeout=0 on gpu-d1 must be at least 1']),
    'model_relative_path': ({'gpu-p1': {'vllm_model': 'models/qwen 3'}},
                            ['vllm_model="models/qwen 3" on gpu-p1 is neither an absolute path nor a hub id']),
    'etcd_election_vs_heartbeat': ({'ctl-1': {'etcd_heartbeat_interval': 500, 'etcd_election_timeout': 1000}},
                                   ['etcd_election_timeout=1000 on ctl-1 is below 5 x etcd_heartbeat_interval=500',
                                    'at least 2500']),
    'etcd_election_too_long': ({'ctl-1': {'etcd_election_timeout': 60000}},
                               ['etcd_election_timeout=60000 on ctl-1 must be at most 50000']),
    'master_watermark_fraction': ({'ctl-1': {'mooncake_master_eviction_high_watermark_ratio': 95}},
                                  ['mooncake_master_eviction_high_watermark_ratio=95 on ctl-1 must be at most 1']),
    'pip_find_links_relative': ({'gpu-p1': {'common_pip_find_links': 'wheels/'}},
                                ['common_pip_find_links="wheels/" on gpu-p1 is neither an http(s)/file URL']),
    'pip_index_not_a_url': ({'router-1': {'common_pip_index_url': 'pypi.internal/simple'}},
                            ['common_pip_index_url="pypi.internal/simple" on router-1 is not an http(s) URL']),
    'pip_requirement': ({'gpu-d1': {'vllm_pip_extra_packages': ['flashinfer==>0.2']}},
                        ['vllm_pip_extra_packages=["flashinfer==>0.2"] on gpu-d1']),
    'systemd_restart_sec': ({'ctl-1': {'mooncake_master_restart_sec': -1}},
                            ['mooncake_master_restart_sec=-1 on ctl-1', 'RestartSec=-1s']),
    'systemd_state_dir': ({'gpu-d1': {'vllm_state_dir': '/srv/vllm'}},
                          ['vllm_state_dir="/srv/vllm" on gpu-d1', 'StateDirectory=/srv/vllm']),
    'gid_index_range': ({'gpu-d1': {'vllm_instances.0.gid_index': 300}},
                        ['vllm_instances[decode0].gid_index=300 on gpu-d1']),
    'router_interval_zero': ({'router-1': {'vllm_router_health_check_interval_secs': 0}},
                             ['vllm_router_health_check_interval_secs=0 on router-1 must be at least 1']),
}


@pytest.mark.parametrize('case', sorted(VALUES_REFUSED))
def test_values_refuses(case):
    changes, expected = VALUES_REFUSED[case]
    assert_refused('values', changes, expected)


VALUES_LEGAL = {
    'vllm_flags_in_range': {'gpu-d1': {'vllm_extra_args': ['--gpu-memory-utilization', '0.85', '--max-num-seqs=128',
                                                           '--swap-space', '0', '--seed', '-1']},
                            'gpu-p1': {'vllm_extra_args': ['--gpu-memory-utilization=1']}},
    'hub_id_and_urls': {'gpu-p1': {'vllm_model': 'Qwen/Qwen3-32B', 'common_pip_index_url': 'https://pypi.internal/simple',
                                   'common_pip_find_links': 'file:///srv/wheels'},
                        'gpu-d1': {'vllm_model': 'Qwen/Qwen3-32B', 'vllm_pip_extra_packages': ['flashinfer-python>=0.2,<0.3']}},
    'etcd_slow_network': {'ctl-1': {'etcd_heartbeat_interval': 250, 'etcd_election_timeout': 2500}},
    'systemd_values': {'ctl-1': {'mooncake_master_restart_sec': 3}, 'gpu-d1': {'vllm_state_dir': '/var/lib/vllm-pd'}},
}


@pytest.mark.parametrize('case', sorted(VALUES_LEGAL))
def test_values_legal(case):
    assert_passes('values', VALUES_LEGAL[case])


def _systemd_ignores(tmp_path, line):
    """The "ignoring" lines of systemd-analyze verify for a unit with line (render mode's own verify)."""
    spec = importlib.util.spec_from_file_location('bt', os.path.join(REPO, 'plugins', 'action', 'bundle_template.py'))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    unit = tmp_path / 'x.service'
    unit.write_text('[Service]\nExecStart=/bin/true\n%s\n' % line)
    lines = mod.systemd_ignoring(str(unit), 'x.service')
    assert lines is not None, 'systemd-analyze not installed: run scripts/install-deps.sh'
    return lines


@pytest.mark.parametrize('var', sorted(pc.core._rules.SYSTEMD_RULES))
def test_systemd_rules_agree_with_systemd(var, tmp_path):
    """Each systemd rule refuses what systemd-analyze verify ignores, and passes what it takes."""
    rule = pc.core._rules.SYSTEMD_RULES[var]
    spec_type = pc.managed._spec_type(SPECS, var)
    # A value of another type ('10min' for an int) is its argument spec's to refuse, not a rule's.
    bad, good = {'mooncake_master_restart_sec': (-1, 3), 'vllm_state_dir': ('/srv/vllm', '/var/lib/vllm-pd')}[var]
    for value, refused in ((bad, True), (good, False)):
        rendered = rule['unit_line'] % (value if var != 'vllm_state_dir' else
                                        (value[len('/var/lib/'):] if value.startswith('/var/lib/') else value))
        assert bool(_systemd_ignores(tmp_path, rendered)) == refused, rendered
        assert (pc.core._rules.refusal(rule, value, spec_type) is not None) == refused, value


# --- class 4: unit sandboxes -------------------------------------------------------------------------

SANDBOX_REFUSED = {
    'model_under_home': ({'gpu-d1': {'vllm_model': '/home/m', 'vllm_served_model_name': 'm'},
                          'gpu-p1': {'vllm_model': '/home/m', 'vllm_served_model_name': 'm'}},
                         ['vllm_model="/home/m" on gpu-d1 is under /home', 'ProtectHome=yes',
                          'vllm@.service fails at start']),
    'model_under_run_user': ({'gpu-p1': {'vllm_model': '/run/user/m'}}, ['vllm_model="/run/user/m" on gpu-p1 is under /run/user']),
    'model_in_tmp': ({'gpu-p1': {'vllm_model': '/tmp/models/m'}},
                     ['vllm_model="/tmp/models/m" on gpu-p1 is under /tmp', 'PrivateTmp=yes']),
    'hf_home_read_only_for_a_hub_model': ({'gpu-p1': {'vllm_model': 'org/m', 'vllm_hf_home': '/srv/hf'}},
                                          ['vllm_hf_home="/srv/hf" on gpu-p1 is read-only for the unit',
                                           'ProtectSystem=strict', 'Fix: put it below /var/lib/vllm']),
    'hf_home_in_var_tmp': ({'gpu-d1': {'vllm_hf_home': '/var/tmp/hf'}},
                           ['vllm_hf_home="/var/tmp/hf" on gpu-d1 is under /var/tmp']),
    'etcd_data_in_tmp': ({'ctl-1': {'etcd_data_dir': '/tmp/etcd'}},
                         ['etcd_data_dir="/tmp/etcd" on ctl-1 is under /tmp', 'lost at every stop']),
    'etcd_data_under_home': ({'ctl-1': {'etcd_data_dir': '/home/etcd-data'}},
                             ['etcd_data_dir="/home/etcd-data" on ctl-1 is under /home']),
}


@pytest.mark.parametrize('case', sorted(SANDBOX_REFUSED))
def test_sandbox_refuses(case):
    changes, expected = SANDBOX_REFUSED[case]
    assert_refused('sandbox', changes, expected)


SANDBOX_LEGAL = {
    'model_under_srv_hf_home_elsewhere': {'gpu-p1': {'vllm_model': '/srv/models/m', 'vllm_hf_home': '/srv/hf'}},
    'hub_model_with_default_hf_home': {'gpu-p1': {'vllm_model': 'org/m'}},
    'hub_model_hf_home_in_state_dir': {'gpu-p1': {'vllm_model': 'org/m', 'vllm_state_dir': '/var/lib/vllm-pd',
                                                  'vllm_hf_home': '/var/lib/vllm-pd/cache/hf'}},
    'etcd_data_in_its_own_dir': {'ctl-1': {'etcd_data_dir': '/data/etcd'}},
    'home_like_names_elsewhere': {'gpu-d1': {'vllm_model': '/srv/home/models/m', 'vllm_served_model_name': 'm'},
                                  'gpu-p1': {'vllm_model': '/srv/home/models/m', 'vllm_served_model_name': 'm'}},
}


@pytest.mark.parametrize('case', sorted(SANDBOX_LEGAL))
def test_sandbox_legal(case):
    assert_passes('sandbox', SANDBOX_LEGAL[case])


def test_sandbox_comes_from_the_macro_and_the_unit_templates():
    """The directives preflight knows are the macro's; each unit's writable paths are its template's lines."""
    assert pc.sandbox.sandbox_directives() == {'ProtectSystem': 'strict', 'ProtectHome': 'yes', 'PrivateTmp': 'yes'}
    for unit, spec in pc.core._rules.UNIT_PATHS.items():
        text = open(os.path.join(REPO, 'templates', spec['template'])).read()
        assert "import hardening" in text, unit
        for line in spec['writable'].values():
            assert line in text, '%s: %s' % (unit, line)


def test_sandbox_reads_other_directives(tmp_path):
    macro = tmp_path / 'hardening.j2'
    macro.write_text('ProtectSystem=full\nProtectHome=read-only\n')
    box = pc.sandbox._sandbox(pc.sandbox.sandbox_directives(str(macro)))
    assert box == {'hidden': [], 'private': [], 'read_only': ['/usr', '/boot', '/efi', '/etc', '/home', '/root',
                                                               '/run/user']}


# --- class 5: addresses ------------------------------------------------------------------------------

ADDRESSES_REFUSED = {
    'two_hosts_one_ip': ({'gpu-d1': {'common_host_ip': '10.0.1.21'}},
                         ['Hosts gpu-d1 (common_host_ip) and gpu-p1 (ansible_host) share the address 10.0.1.21']),
    'no_address_at_all': ({'router-1': {'ansible_host': None}},
                          ['router-1 has no usable cluster address', 'the inventory name']),
    'dns_name': ({'gpu-p1': {'ansible_host': 'gpu-p1.example.com'}},
                 ['gpu-p1 has no usable cluster address', 'ansible_host="gpu-p1.example.com"', 'FACTS failure mode 6']),
    'loopback': ({'ctl-1': {'common_host_ip': '127.0.0.1'}},
                 ['ctl-1 has no usable cluster address', 'common_host_ip="127.0.0.1" is a loopback address']),
    'unspecified': ({'gpu-d1': {'common_host_ip': '0.0.0.0'}}, ['common_host_ip="0.0.0.0" is the unspecified address']),
    'instance_on_another_hosts_ip': ({'gpu-d1': {'vllm_instances.0.host_ip': '10.0.1.21'}},
                                     ['vllm_instances[decode0].host_ip="10.0.1.21" on gpu-d1 is the address of gpu-p1']),
    'instance_on_loopback': ({'gpu-p1': {'vllm_instances.1.host_ip': '127.0.0.1'}},
                             ['vllm_instances[prefill1].host_ip="127.0.0.1" on gpu-p1 is a loopback address']),
}


@pytest.mark.parametrize('case', sorted(ADDRESSES_REFUSED))
def test_addresses_refuses(case):
    changes, expected = ADDRESSES_REFUSED[case]
    assert_refused('addresses', changes, expected)


ADDRESSES_LEGAL = {
    'two_instances_share_nics_and_ip': {'gpu-p1': {'vllm_instances.0.nics': ['mlx5_0', 'mlx5_1'],
                                                   'vllm_instances.1.nics': ['mlx5_0', 'mlx5_1']}},
    'instance_on_a_second_ip_of_its_host': {'gpu-p1': {'vllm_instances.1.host_ip': '10.0.2.21'}},
    'instance_host_ip_is_its_own_host': {'gpu-d1': {'vllm_instances.0.host_ip': '10.0.1.31'}},
    'ipv6_cluster_address': {'gpu-d1': {'common_host_ip': 'fd00::31'}},
    'ssh_name_with_cluster_ip': {'gpu-p1': {'ansible_host': 'gpu-p1.example.com', 'common_host_ip': '10.0.1.21'}},
}


@pytest.mark.parametrize('case', sorted(ADDRESSES_LEGAL))
def test_addresses_legal(case):
    assert_passes('addresses', ADDRESSES_LEGAL[case])


def test_hosts_outside_the_bundle_groups_need_no_address():
    inv = inv_with({'ctl-2': {'ansible_host': None}})  # ctl-2 is in no group of GROUPS
    assert run_class('addresses', inv) == []


def test_master_and_etcd_tables_are_their_renderers():
    """The master's flags and etcd's environment are read from the files that render them."""
    flags = pc.managed._renderer_names(*pc.managed.MASTER_ARGS_RENDERER)
    assert {'--rpc_port', '--metrics_port', '--enable_ha', '--cluster_id'} <= set(flags)
    env = pc.managed._renderer_names(*pc.managed.ETCD_ENV_RENDERER)
    assert {'ETCD_NAME', 'ETCD_DATA_DIR', 'ETCD_INITIAL_CLUSTER', 'ETCD_LISTEN_CLIENT_URLS'} <= set(env)


def test_value_rules_name_real_settings_and_take_types_from_the_specs():
    """Every rule is about a setting a role's argument spec declares; a number's type is the spec's."""
    rules = dict(pc.core._rules.SYSTEMD_RULES)
    for per_role in pc.core._rules.VAR_RULES.values():
        rules.update(per_role)
    for var, rule in rules.items():
        opt = pc.core._option(SPECS, var)
        assert opt, '%s: no argument spec declares it' % var
        assert 'type' not in rule, '%s: the type lives in the argument spec' % var
        if 'kind' not in rule:
            assert opt.get('type') in ('int', 'float'), var


# --- class 5 (per host): addresses other hosts must reach (REACHABLE) --------------------------------------------
# One host of each role, the groups it is in, and its cluster address.
ROLE_HOST = {'master': ('ctl-1', GROUPS, '10.0.0.11'), 'vllm': ('gpu-p1', GROUPS, '10.0.1.21'),
             'router': ('router-1', GROUPS, '10.0.0.41'), 'entry': ('entry-1', ENTRY_GROUPS, '10.0.0.51'),
             'etcd': ('ctl-1', GROUPS, '10.0.0.11'), 'monitoring': ('mon-1', MON_GROUPS, '10.0.0.61')}
LOOPBACKS = ['127.0.0.1', '127.0.1.1', '::1', 'localhost', '::ffff:127.0.0.1']
WILDCARDS = ['0.0.0.0', '::', '*']


def _reachable_cases():
    """(label, var, value, refused phrase or None) for every address of REACHABLE: loopback, a port suffix (on
    the host's own address and on a loopback one), a wildcard (refused where the address is advertised), "" and a
    name."""
    out = []
    for var, a in sorted(pc.addresses.REACHABLE.items()):
        ip = ROLE_HOST[a['role']][2] if var != 'entry_vip' else '10.0.0.50'
        out += [(var, v, 'loopback') for v in LOOPBACKS]
        out += [(var, ip + ':8000', 'has a port suffix (:8000)'), (var, '[fd00::5]:8000', 'has a port suffix (:8000)'),
                (var, '127.0.0.1:8000', 'has a port suffix (:8000)'), (var, 'ctl-1.example.com', 'is not an IP address')]
        out += [(var, v, None if a['wildcard'] else 'is the unspecified address') for v in WILDCARDS if v != '*']
        out.append((var, '*', None if a['wildcard'] == '*' else 'a wildcard only HAProxy reads' if a['wildcard']
                    else 'is the unspecified address'))
        out += [(var, '', None if a['empty'] else 'is empty'), (var, ip, None)]
    return out


REACHABLE_CASES = _reachable_cases()


@pytest.mark.parametrize('var,value,refused', REACHABLE_CASES,
                         ids=['%s=%s' % (c[0], c[1] or '""') for c in REACHABLE_CASES])
def test_reachable_addresses(var, value, refused):
    """Each address another host must reach is refused loopback, a port suffix and a name everywhere, a wildcard
    where it is advertised, "" where it does not mean "derive it"; the message names the variable, the host and
    the fix (the port's own variable for a port suffix)."""
    a = pc.addresses.REACHABLE[var]
    host, groups, _ = ROLE_HOST[a['role']]
    if not refused:
        assert_passes('addresses', {host: {var: value}}, groups)
        return
    expected = ['%s="%s" on %s' % (var, value, host), refused]
    if 'port suffix' in refused:
        expected.append(a['port'])
    assert_refused('addresses', {host: {var: value}}, expected, groups)


def test_reachable_addresses_only_where_the_role_runs():
    """A router's address setting on a host that runs no router is not read there."""
    assert_passes('addresses', {'gpu-p1': {'vllm_router_host': '127.0.0.1', 'entry_vip': '127.0.0.1',
                                           'mooncake_master_rpc_address': '0.0.0.0'}})


def test_reachable_port_suffix_fix_names_the_address_and_the_port():
    (msg,) = pc.addresses.addresses_reachable(fleet(inv_with({'ctl-1': {'mooncake_master_rpc_address': '10.0.0.11:50051'}}))
                                    ['ctl-1']['_preflight_cfg'], 'ctl-1', GROUPS, SPECS)
    assert 'Fix: set mooncake_master_rpc_address to "10.0.0.11" alone and the port in mooncake_master_rpc_port.' in msg


def test_a_vip_the_address_check_refuses_is_named_once():
    """entry_vip leaves a loopback, bind-any or ADDR:PORT VIP to addresses_reachable (one message per mistake)."""
    for vip in ('127.0.0.50', '0.0.0.0', '10.0.0.50:443'):
        inv = inv_with({h: {'entry_vip': vip} for h in ('entry-1', 'entry-2')})
        assert pc.entry.entry_vip(fleet(inv), 'ctl-1', ENTRY_GROUPS, SPECS) == []
        assert run_class('addresses', inv, ENTRY_GROUPS)


def test_port_suffix_named_for_the_hosts_own_address():
    text = ' '.join(run_class('ips', inv_with({'gpu-p1': {'common_host_ip': '10.0.1.21:22'}}))
                    + run_class('addresses', inv_with({'gpu-p1': {'common_host_ip': '10.0.1.21:22'}})))
    assert 'common_host_ip="10.0.1.21:22" on gpu-p1 is not an IPv4/IPv6 address (it has a port suffix, :22' in text
    assert 'gpu-p1 has no usable cluster address (checked on ctl-1): common_host_ip="10.0.1.21:22" has a port suffix' in text
    msgs = run_class('instances', inv_with({'gpu-d1': {'vllm_instances.0.host_ip': '10.0.1.31:8200'}}))
    assert any('host_ip="10.0.1.31:8200" is not an IPv4/IPv6 address (it has a port suffix, :8200' in m for m in msgs)


def test_reachable_is_every_address_setting_of_the_specs():
    """One table: every *_host, *_address, *_vip, *_ip option of the roles' argument specs is in REACHABLE, but the
    host's own address (common_host_ip: addresses_usable); its ports and roles are real."""
    import re
    names = {var for spec in SPECS for var in spec['options'] if re.search(r'(_host|_address|_vip|_ip)$', var)}
    assert names == set(pc.addresses.REACHABLE) | {'common_host_ip'}
    roles = set(pc.core._roles('x', {}))
    for var, a in pc.addresses.REACHABLE.items():
        assert a['role'] in roles, var
        assert a['port'] == 'vllm_instances[].port' or pc.core._option(SPECS, a['port']), var
        assert pc.core._option(SPECS, var).get('type') == 'str', var


# --- class 6: TLS paths (TLS_PATHS) --------------------------------------------------------------------------------

def _tls_cases():
    """(var, value, refused phrase or None) for every path of TLS_PATHS while its TLS is on."""
    out = []
    for role, t in sorted(pc.tls.TLS_PATHS.items()):
        for var, (where, need, _) in sorted(t['paths'].items()):
            out += [(var, '', None if need == 'optional' else 'is empty'),
                    (var, 'pki/x.pem', 'is not an absolute path'), (var, '/srv/pki/x.pem', None)]
            if where == 'controller':
                out.append((var, '~/pki/x.pem', None))
    return out


TLS_CASES = _tls_cases()
TLS_ON = {'etcd_tls_enabled': True}


def _tls_role(var):
    return next(role for role, t in pc.tls.TLS_PATHS.items() if var in t['paths'])


@pytest.mark.parametrize('var,value,refused', TLS_CASES, ids=['%s=%s' % (c[0], c[1] or '""') for c in TLS_CASES])
def test_tls_paths(var, value, refused):
    """Each path TLS uses, while that TLS is on: empty (where "" is no choice of its own) and relative refused,
    naming the variable, the host, the switch and the fix; absolute passes (~ on the controller)."""
    host, groups, _ = ROLE_HOST[_tls_role(var)]
    changes = dict(TLS_ON, **{var: value})
    if var == 'entry_tls_ca_dir':  # used while the bundle's entry CA issues the certificate (no operator files)
        changes.update(entry_tls_cert_file='', entry_tls_key_file='')
    if not refused:
        assert_passes('tls', {host: changes}, groups)
        return
    switch = pc.tls.TLS_PATHS[_tls_role(var)]['switch']
    assert_refused('tls', {host: changes}, ['%s="%s" on %s %s' % (var, value, host, refused)]
                   + (['while %s is true' % switch] if switch else []) + ['Fix: set %s to an absolute path' % var], groups)


def test_tls_paths_only_while_tls_is_on():
    assert_passes('tls', {'ctl-1': {'etcd_tls_enabled': False, 'etcd_ca_file': '', 'etcd_tls_ca_dir': 'pki'}})
    # the bundle's entry CA is not used with the operator's own files: its directory is not read
    assert_passes('tls', {'entry-1': {'entry_tls_cert_file': '/srv/pki/e.crt', 'entry_tls_key_file': '/srv/pki/e.key',
                                      'entry_tls_ca_dir': ''}}, ENTRY_GROUPS)
    # an etcd path on a host that runs no etcd member
    assert_passes('tls', {'gpu-p1': {'etcd_tls_enabled': True, 'etcd_ca_file': ''}})


def test_entry_files_named_once_when_relative():
    """A relative operator file is tls_paths' (a path the lookup reads from the controller's role search path,
    not from where ansible-playbook runs); entry_tls_files does not repeat it as "not a file"."""
    inv = inv_with({'entry-1': {'entry_tls_cert_file': 'no/such.crt', 'entry_tls_key_file': 'no/such.key'}})
    assert run_class('entry', inv, ENTRY_GROUPS) == []
    assert len(run_class('tls', inv, ENTRY_GROUPS)) == 2


def test_tls_paths_are_the_paths_the_tls_tasks_use():
    """One table: TLS_PATHS holds exactly the path settings the TLS tasks and templates read (etcd: its TLS tasks;
    entry: its certificate tasks; each passes them to the one chain, roles/common/tasks/tls_issue.yml;
    monitoring: the etcd scrape job's tls_config), each declared by a spec."""
    import re

    def names(pattern, *files):
        return {n for f in files for n in re.findall(pattern, open(os.path.join(REPO, f)).read())}
    assert names(r'\b(etcd_[a-z_]+_(?:file|dir))\b', 'roles/etcd/tasks/configure_tls.yml') \
        == set(pc.tls.TLS_PATHS['etcd']['paths'])
    assert names(r'\b(entry_tls_[a-z_]+_(?:file|dir))\b', 'roles/entry/tasks/configure.yml') \
        == set(pc.tls.TLS_PATHS['entry']['paths'])
    assert names(r'\b(monitoring_[a-z_]+_dir)\b', 'templates/monitoring/scrape_configs.yml.j2') \
        == set(pc.tls.TLS_PATHS['monitoring']['paths'])
    for t in pc.tls.TLS_PATHS.values():
        assert t['switch'] is None or pc.core._option(SPECS, t['switch']).get('type') == 'bool'
        for var in t['paths']:
            assert pc.core._option(SPECS, var).get('type') == 'str', var


def test_role_guards_are_registration_parameters():
    """A per-host check that applies to one role says so in @check(role=...), and the runner (applies) skips other
    hosts: no check body repeats `if not _roles(...)[role]: return []` (issue 33: one guard, not 34 copies). The
    runner's own skip is shown on a host that runs no monitoring."""
    import re
    from test_preflight_messages import CHECK_FILES
    src = ''.join(open(path).read() for path in CHECK_FILES)  # the filter file and every module of the package
    assert not re.findall(r"if not _roles\(host, groups(?:, cfg)?\)\['[a-z_]+'\]", src)
    guarded = [c for c in pc.CHECKS if c['role']]
    assert len(guarded) >= 30 and all(c['scope'] == 'host' for c in guarded)
    mon = next(c for c in pc.CHECKS if c['id'] == 'monitoring_settings')
    assert mon['role'] == 'monitoring'
    assert not pc.applies(mon, {}, 'ctl-1', {'monitoring': ['mon-1']})
    assert pc.applies(mon, {}, 'mon-1', {'monitoring': ['mon-1']})
    assert pc.host_errors({'monitoring_retention': 'x'}, 'ctl-1', {'monitoring': ['mon-1']}, SPECS) == []
    assert pc.host_errors({'monitoring_retention': 'x'}, 'mon-1', {'monitoring': ['mon-1']}, SPECS, skip=[
        c['skip'] for c in pc.CHECKS if c['skip'] != 'monitoring']) != []


def test_a_role_alone_runs_the_one_python_check():
    """The roles' YAML preflight (etcd, vllm, firewall: for their playbooks run alone) calls preflight_checks_of with
    check ids: the same code as the preflight play, refusing what it refuses; an unknown id fails loudly; a role-bound
    check skips a host outside its role; and no YAML preflight task repeats a check's logic (each names its ids)."""
    import re
    assert pc.checks_of({}, ['groups_etcd_odd'], 'etcd-1', {'etcd': ['etcd-1', 'etcd-2']}) != []
    assert pc.checks_of({}, ['groups_etcd_odd'], 'etcd-1', {'etcd': ['etcd-1', 'etcd-2', 'etcd-3']}) == []
    gpu = {'vllm_lab_cpu_device_guard': True, 'vllm_platform': 'cuda'}
    assert pc.checks_of(gpu, ['packages_cpu_guard'], 'gpu-p1', {'vllm_prefill': ['gpu-p1']})
    assert pc.checks_of(gpu, ['packages_cpu_guard'], 'ctl-1', {'vllm_prefill': ['gpu-p1']}) == []  # not a vLLM host
    assert pc.checks_of({'firewall_enabled': True, 'firewall_extra_sources': ['10.0.0.5/24']}, ['firewall_sources'],
                        'h', {}) != []
    with pytest.raises(ValueError, match='no such check'):
        pc.checks_of({}, ['no_such_check'], 'h', {})
    for role in ('etcd', 'vllm', 'firewall'):
        text = open(os.path.join(REPO, 'roles', role, 'tasks', 'preflight.yml')).read()
        ids = re.findall(r"preflight_checks_of\(\[([^\]]*)\]", text)
        assert ids, role
        for name in re.findall(r"'([a-z_]+)'", ' '.join(ids)):
            assert any(c['id'] == name for c in pc.CHECKS), name
