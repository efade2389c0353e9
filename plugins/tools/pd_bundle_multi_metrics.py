"""Store tier: MultiConnector's Prometheus metrics skip a child connector that has none.

Why: with MultiConnector(MooncakeConnector, MooncakeStoreConnector), vLLM 0.32 builds its Prometheus registry from
the children whose build_prom_metrics returns one (MooncakeStoreConnector only), then asserts, for every child that
reported transfer statistics, that it is in that registry. MooncakeConnector reports statistics after its first
P2P hand-off, so the first request that reaches decode kills the API server's output handler and the instance
shuts down (exit 0). Seen on the lab: "AssertionError: MooncakeConnector is not contained in the list of registered
connectors with Prometheus metrics support: dict_keys(['MooncakeStoreConnector'])". Upstream: vLLM issue #43828,
PR #43836 ("skip missing MultiConnector Prometheus metrics"); that change retires this file.

The patch wraps MultiKVConnectorPromMetrics.observe: statistics of a child with no Prometheus metrics are left out,
the rest go to vLLM's own observe unchanged. It reads one private attribute, _prom_metrics (a dict); where that is
missing (another vLLM), the API server refuses to start when it builds its metrics, naming the way out (vllm_store_tier: false), rather than run
into the assertion at the first transfer. Active only where the env file sets PD_BUNDLE_MULTI_METRICS (the vllm
role sets it on store-tier instances); prints ACTIVE to the unit's journal when it patched.
"""
import functools
import os
import sys

# patch_on_import, refuse_patch, vllm_version: defined above this file in sitecustomize.py (pd_bundle_import_hook.py);
# unit tests set them.

MULTI_ENV = "PD_BUNDLE_MULTI_METRICS"
MULTI_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector"
# The names the patch needs, as scripts/conformance/conformance.py reads them in each vLLM's source (CLASS.ATTR: an
# attribute of a class, or one its methods set on self).
MULTI_TARGETS = {MULTI_MODULE: ("MultiKVConnectorPromMetrics.observe", "MultiKVConnectorPromMetrics._prom_metrics")}
MULTI_ACTIVE = "pd-bundle: MultiConnector metrics skip children without Prometheus metrics"


def _refuse_multi(what):
    refuse_patch("pd_bundle_multi_metrics", vllm_version(), "%s (the patch is written for vLLM 0.32's %s)" % (what, MULTI_MODULE),
                 "set vllm_store_tier: false for this vLLM and re-run site.yml",
                 why="With %s=1 (vllm_store_tier) and without the patch the first P2P hand-off would stop the API "
                     "server (vLLM issue #43828)." % MULTI_ENV)


def wrap_observe(original):
    """observe() that leaves out the statistics of children with no Prometheus metrics."""
    @functools.wraps(original)
    def observe(self, transfer_stats_data, engine_idx=0):
        known = getattr(self, "_prom_metrics", None)
        if not isinstance(known, dict):
            _refuse_multi("MultiKVConnectorPromMetrics has no _prom_metrics dict")
        if transfer_stats_data:
            transfer_stats_data = {k: v for k, v in transfer_stats_data.items() if k in known}
        return original(self, transfer_stats_data, engine_idx)
    return observe


def patch_multi(module):
    cls = getattr(module, "MultiKVConnectorPromMetrics", None)
    observe = getattr(cls, "observe", None)
    if observe is None:
        _refuse_multi("%s has no MultiKVConnectorPromMetrics.observe" % module.__name__)
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if not isinstance(getattr(self, "_prom_metrics", None), dict):  # when the engine's loggers are made
            _refuse_multi("MultiKVConnectorPromMetrics has no _prom_metrics dict")
    cls.__init__ = __init__
    cls.observe = wrap_observe(observe)
    print(MULTI_ACTIVE, file=sys.stderr, flush=True)


def install_multi_metrics(environ=os.environ):
    """Hook the module's import; returns True when the env file asks for it."""
    on = environ.get(MULTI_ENV, "") == "1"
    if on:
        patch_on_import(MULTI_MODULE, patch_multi)
    return on


install_multi_metrics()
