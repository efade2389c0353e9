"""vLLM's --kv-transfer-config of one instance: P2P, store mode, or P2P with the store as a reuse tier.

Why a plugin: the tier nests two connector configs in vLLM's MultiConnector, and the store keys' namespace
(cache_prefix) must be built the same way on every instance that shares a store, or reuse silently stops.
"""

# vLLM 0.32/0.33: MooncakeStoreConnector keys are "<cache_prefix>@<model dir name>...@<block hash>"
# (vllm/distributed/kv_transfer/kv_connector/v1/mooncake/store/data.py, PoolKey.build_prefix): '@' separates
# the parts, so the prefix must not hold one; whitespace would end up in a key too.
_FORBIDDEN = ('@', ' ', '\t', '\n')


def store_cache_prefix(served_name, revision):
    """'<served model name>:<revision>': the store keys' namespace. The model's directory name alone (vLLM's
    key) stays the same across a weights upgrade; the revision makes old KV unreachable. Raises on an empty
    revision or a character a key cannot carry (preflight refuses both first, with the fix)."""
    name, rev = str(served_name or '').strip(), str(revision or '').strip()
    if not name or not rev:
        raise ValueError('store_cache_prefix: vllm_served_model_name and vllm_model_revision must be set '
                         '(got %r, %r)' % (served_name, revision))
    out = '%s:%s' % (name, rev)
    bad = [c for c in _FORBIDDEN if c in out]
    if bad:
        raise ValueError('store_cache_prefix: %r holds %r, which the store keys use as a separator' % (out, bad))
    return out


def vllm_kv_transfer_config(p2p, store_tier=False, store_mode=False, cache_prefix=''):
    """The instance's kv-transfer-config from its own single-connector config p2p ({kv_connector, kv_role,
    engine_id, kv_load_failure_policy, kv_connector_extra_config}).

    store_mode: p2p is MooncakeStoreConnector already; its extra config gains cache_prefix.
    store_tier (a prefill in P2P mode): MultiConnector, MooncakeConnector first (the hand-off to decode, and
    the connector whose bootstrap server the routers query) and MooncakeStoreConnector second, kv_both: it
    loads what another prefill stored and stores what this one computed. MultiConnector loads from the first
    child that has tokens; a P2P producer never has any, so store hits come from the second. Its failure policy is
    always recompute: a producer loads from the store only, and the store is an optimisation whose outage must cost a
    recompute, never a request (issue 44; the instance's policy is decode's, for the P2P pull)."""
    kv = dict(p2p)
    if store_mode:
        kv['kv_connector_extra_config'] = dict(kv.get('kv_connector_extra_config') or {}, cache_prefix=cache_prefix)
        return kv
    if not store_tier:
        return kv
    if kv.get('kv_connector') != 'MooncakeConnector':
        raise ValueError('vllm_kv_transfer_config: the store tier sits behind MooncakeConnector, not %r'
                         % kv.get('kv_connector'))
    store = {'kv_connector': 'MooncakeStoreConnector', 'kv_role': 'kv_both',
             'kv_connector_extra_config': {'cache_prefix': cache_prefix}}
    child = {k: v for k, v in kv.items() if k != 'engine_id'}
    return {'kv_connector': 'MultiConnector', 'kv_role': kv.get('kv_role'), 'engine_id': kv.get('engine_id'),
            'kv_load_failure_policy': 'recompute',  # the scheduler reads MultiConnector's
            'kv_connector_extra_config': {'connectors': [child, store]}}


def without_store_tier(kv):
    """The P2P config a tier instance would have without the tier (the inverse of vllm_kv_transfer_config with
    store_tier): MultiConnector's MooncakeConnector child with the engine id back. Any other config is returned
    as it is. playbooks/benchmark.yml runs the reuse workload with and without the tier this way."""
    kv = dict(kv)
    if kv.get('kv_connector') != 'MultiConnector':
        return kv
    children = (kv.get('kv_connector_extra_config') or {}).get('connectors') or []
    p2p = [c for c in children if c.get('kv_connector') == 'MooncakeConnector']
    if len(p2p) != 1:
        raise ValueError('without_store_tier: a MultiConnector config without exactly one MooncakeConnector: %r'
                         % [c.get('kv_connector') for c in children])
    return dict(p2p[0], engine_id=kv.get('engine_id'))


class FilterModule(object):
    def filters(self):
        return {
            'bundle_store_cache_prefix': store_cache_prefix,
            'bundle_vllm_kv_transfer_config': vllm_kv_transfer_config,
            'bundle_vllm_kv_without_store_tier': without_store_tier,
        }
