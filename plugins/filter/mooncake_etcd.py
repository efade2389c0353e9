"""What the Mooncake processes keep in etcd, and whether it agrees with the masters: one place for
playbooks/status.yml (through plugins/filter/status.py) and tests/infra/test_etcd_keys.py.

Seen on the lab (mooncake 0.3.13.post1, etcd 3.4): the HA masters (--enable_ha --cluster_id=ID) elect their
leader with ONE key, mooncake-store/ID/master_view. Its value is the leader's RPC address as the masters
name it (--rpc_address:--rpc_port, e.g. "172.30.0.11:50051"), and it is attached to a lease granted with a
TTL of 5 s that the leader keeps alive; when the leader dies, the lease expires and a standby puts its own
address. The masters' /health reports the same address (leader_address) and the key's revision (view_version).
With OpLog replication on (mooncake_master_oplog, --enable_oplog) the masters also write under /oplog/ID/, outside
the prefixes below (the standby replays the leader's metadata from there).

Store mode with the etcd metadata backend (mooncake_metadata_backend auto with HA masters): every transfer
engine, one per vLLM worker of a store-mode instance, puts its segment description under
mooncake/ram/SEGMENT and its RPC endpoint under mooncake/rpc_meta/SEGMENT (SEGMENT = "local_hostname:rpc
port"; the bundle sets no MC_METADATA_CLUSTER_ID, which would insert a level). These keys have NO lease
(the engine's etcd plugin puts them plainly): an engine that exits cleanly deletes them, one that is killed
leaves them behind. P2P mode (MooncakeConnector) keeps nothing in etcd, and neither does the store tier
(vllm_store_tier): its store clients handshake directly (metadata_server P2PHANDSHAKE).
"""

# The masters' HA keys: mooncake-store/<cluster id>/master_view.
MASTER_PREFIX = 'mooncake-store/'
MASTER_VIEW = 'master_view'
# The transfer engines' metadata (store mode, etcd backend): mooncake/ram/<segment>, mooncake/rpc_meta/<segment>.
ENGINE_PREFIX = 'mooncake/'
ENGINE_KINDS = ('ram', 'rpc_meta')
# Every key the bundle's Mooncake processes may write starts with one of these.
PREFIXES = (MASTER_PREFIX, ENGINE_PREFIX)


def master_view_key(cluster_id):
    """The masters' HA key for mooncake_cluster_id."""
    return '%s%s/%s' % (MASTER_PREFIX, cluster_id, MASTER_VIEW)


def engine_segment(key):
    """'ip:port' of a transfer engine's metadata key (mooncake/ram/S, mooncake/rpc_meta/S), else None."""
    for kind in ENGINE_KINDS:
        head = '%s%s/' % (ENGINE_PREFIX, kind)
        if key.startswith(head) and len(key) > len(head):
            return key[len(head):]
    return None


def split_hostport(text):
    """('ip', port) of 'ip:port' or '[v6]:port'; None when it is not one."""
    host, sep, port = str(text or '').rpartition(':')
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip('[]'), int(port)


def unowned_keys(keys, cluster_id, running_segments):
    """Keys under PREFIXES that belong to no running process: a master view of another cluster id, an engine
    segment that no running store-mode instance serves (running_segments: the 'ip:port' of every running
    engine), anything else under the prefixes (Mooncake writes nothing else). The cluster's own master view
    is not judged here (master_view_problems does, with its lease)."""
    own = master_view_key(cluster_id)
    running = set(running_segments or [])
    out = []
    for key in sorted(keys or []):
        if key == own or not key.startswith(PREFIXES):
            continue
        seg = engine_segment(key)
        if seg is None or seg not in running:
            out.append(key)
    return out


def master_view_problems(view, masters, ha=True):
    """Why etcd's master view and the masters' own view disagree; [] when they agree.

    view: what etcd holds under master_view_key: {'value': 'ip:port' or None (no key), 'lease_ttl': seconds
          left on its lease (None: no lease), 'error': why it could not be read (None when read)}.
    masters: one dict per master of the inventory: {'host', 'address' (its own RPC 'ip:port'), 'healthy'
          (its /health answered ok), 'role' ('leader'/'standby'), 'leader_address' (whom it follows)}.
    ha: whether the masters run HA (without it they keep nothing in etcd, and nothing is compared).
    A master that does not answer is not compared (its unit row is red already); neither is a view when no
    master reports leader (the table is red for that already), except that then the view naming a master
    that does not lead is said (the stuck election the master watchdog restarts)."""
    if not ha:
        return []
    if view.get('error'):
        return ['etcd master view: not read (%s)' % view['error']]
    value = view.get('value')
    if not value:
        return ['etcd master view: no key (no master holds the leadership in etcd)']
    problems = []
    ttl = view.get('lease_ttl')
    if ttl is None or int(ttl) <= 0:
        problems.append('etcd master view: %s has no live lease (TTL %s): it outlives its writer' % (value, ttl))
    by_addr = {m.get('address'): m.get('host') for m in masters}
    if value not in by_addr:
        problems.append('etcd master view names %s, which is no master of the inventory (%s)'
                        % (value, ', '.join('%s=%s' % (m.get('host'), m.get('address')) for m in masters)))
    answering = [m for m in masters if m.get('healthy')]
    leaders = [m for m in answering if m.get('role') == 'leader']
    if not leaders:
        if value in by_addr:
            problems.append('etcd master view names %s (%s), which does not lead' % (by_addr[value], value))
        return problems
    for m in leaders:
        if m.get('address') != value:
            problems.append('%s reports leader, but etcd names %s (%s)' % (m.get('host'), by_addr.get(value, '?'), value))
    for m in answering:
        if m.get('leader_address') and m.get('leader_address') != value:
            problems.append('%s (%s) follows %s, but etcd names %s'
                            % (m.get('host'), m.get('role'), m.get('leader_address'), value))
    return problems


class FilterModule(object):
    def filters(self):
        return {
            'bundle_master_view_key': master_view_key,
        }
