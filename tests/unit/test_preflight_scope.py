"""The fleet check role_scope (plugins/plugin_utils/preflight/scope.py): a variable of etcd, mooncake_master,
vllm_router or entry set for a host outside that role's groups, read by nothing there, is refused (issue 45: no
setting silently ignored); group_vars/all's value, a role's own hosts and a variable another role reads pass."""
import os

import yaml
from test_preflight_checks import REPO, ROLE_GROUPS, SPECS, fleet, pc

scope = pc.scope

GROUPS = {'all': ['etcd-1', 'gpu-p1', 'gpu-d1', 'router-1', 'router-2', 'bastion'], 'etcd': ['etcd-1'],
          'mooncake_master': ['etcd-1'], 'vllm_prefill': ['gpu-p1'], 'vllm_decode': ['gpu-d1'],
          'vllm_router': ['router-1', 'router-2']}


def hostvars(**per_host):
    """Every host of GROUPS with its own {var: value} (per_host: host=dict); the others empty."""
    return {h: dict(per_host.get(h.replace('-', '_'), {})) for h in GROUPS['all']}


def refused(hv):
    """role_scope's messages, with hostvars as the fleet checks get them (each host's effective settings beside)."""
    return scope.role_scope(fleet(hv), 'etcd-1', GROUPS, SPECS)


def test_a_router_setting_on_a_prefill_host_is_refused_naming_it_the_role_and_the_fix():
    msgs = refused(hostvars(gpu_p1={'vllm_router_canary_failures': 5}))
    assert len(msgs) == 1
    msg = msgs[0]
    assert msg.startswith('vllm_router_canary_failures=5 on gpu-p1 is ignored: gpu-p1 does not run the vllm_router role')
    assert 'the group vllm_router' in msg and 'checked on etcd-1' in msg
    assert 'Fix: set vllm_router_canary_failures in group_vars/vllm_router' in msg


def test_each_scoped_role_is_refused_outside_its_groups():
    for var, role in (('entry_maxconn', 'entry'), ('etcd_cluster_token', 'etcd'),
                      ('mooncake_master_snapshot_retention', 'mooncake_master')):
        msgs = refused(hostvars(gpu_d1={var: 7}))
        assert len(msgs) == 1 and msgs[0].startswith('%s=7 on gpu-d1 is ignored' % var) and role in msgs[0], msgs


def test_group_vars_all_and_the_roles_own_hosts_pass():
    every = {'vllm_router_canary_failures': 3}
    assert refused(hostvars(**{h.replace('-', '_'): every for h in GROUPS['all']})) == []
    # all sets 3, group_vars/vllm_router 5: the routers' own value.
    hv = hostvars(**{h.replace('-', '_'): dict(every) for h in GROUPS['all']})
    for r in GROUPS['vllm_router']:
        hv[r]['vllm_router_canary_failures'] = 5
    assert refused(hv) == []
    # all sets 3, the prefill host 5: that host only.
    hv['gpu-p1']['vllm_router_canary_failures'] = 5
    msgs = refused(hv)
    assert len(msgs) == 1 and ' on gpu-p1 ' in msgs[0]


def test_a_host_outside_the_bundle_is_not_its_business():
    assert refused(hostvars(bastion={'vllm_router_canary_failures': 5})) == []


def test_a_value_another_role_or_a_plugin_reads_is_left_alone():
    # The vllm role reads the routers' key and port on its own hosts; a plugin may read any host's value.
    assert {'vllm', 'plugins'} <= scope.readers()['vllm_router_api_key']
    assert refused(hostvars(gpu_p1={'vllm_router_api_key': 'k', 'vllm_router_port': 8000})) == []
    # A variable of a role outside SCOPED_ROLES (vllm runs on spare hosts too) is never this check's.
    assert refused(hostvars(router_1={'vllm_drain_on_restart': False})) == []


def test_readers_count_roles_and_plugins_but_not_preflights_own_code(tmp_path):
    (tmp_path / 'roles' / 'a' / 'tasks').mkdir(parents=True)
    (tmp_path / 'roles' / 'a' / 'tasks' / 'main.yml').write_text('- debug: {msg: "{{ a_only }}"}\n')
    (tmp_path / 'templates' / 'a').mkdir(parents=True)
    (tmp_path / 'templates' / 'a' / 'x.j2').write_text('{{ a_template }}\n')
    (tmp_path / 'plugins' / 'filter').mkdir(parents=True)
    (tmp_path / 'plugins' / 'filter' / 'f.py').write_text('hv["by_a_plugin"]\n')
    (tmp_path / 'plugins' / 'filter' / 'preflight.py').write_text('hv["by_preflight"]\n')
    (tmp_path / 'plugins' / 'plugin_utils' / 'preflight').mkdir(parents=True)
    (tmp_path / 'plugins' / 'plugin_utils' / 'preflight' / 'c.py').write_text('hv["by_preflight_checks"]\n')
    found = scope.readers(str(tmp_path))
    assert found['a_only'] == {'a'} and found['a_template'] == {'a'} and found['by_a_plugin'] == {'plugins'}
    assert 'by_preflight' not in found and 'by_preflight_checks' not in found


def _plays():
    for name in sorted(os.listdir(os.path.join(REPO, 'playbooks'))):
        if name.endswith('.yml'):
            for play in yaml.safe_load(open(os.path.join(REPO, 'playbooks', name))) or []:
                if isinstance(play, dict) and 'hosts' in play:
                    yield name, play


def _roles_of(play):
    """(role, the task's when or '') of every role a play applies."""
    out = [(r if isinstance(r, str) else r.get('role') or r.get('name'), '') for r in play.get('roles') or []]
    for section in ('pre_tasks', 'tasks', 'post_tasks'):
        for task in play.get(section) or []:
            for key in ('ansible.builtin.include_role', 'ansible.builtin.import_role'):
                if isinstance(task, dict) and key in task:
                    out.append((task[key]['name'], str(task.get('when') or '')))
    return [(r.rsplit('.', 1)[-1], when) for r, when in out]


def test_the_scoped_roles_run_only_on_their_own_groups():
    """SCOPED_ROLES holds only roles whose every play targets their own group (preflight_role_groups): the play's
    hosts are the group (or picked from it), or the task that applies the role runs only on the group's hosts
    (render.yml). A host outside it never runs the role."""
    seen = set()
    for name, play in _plays():
        for role, when in _roles_of(play):
            if role not in scope.SCOPED_ROLES:
                continue
            seen.add(role)
            (group,) = ROLE_GROUPS[role]
            hosts = str(play['hosts'])
            assert hosts == group or "groups.get('%s'" % group in hosts \
                or "inventory_hostname in groups.get('%s', [])" % group == when.strip(), (name, hosts, when, role)
    assert seen == set(scope.SCOPED_ROLES)
