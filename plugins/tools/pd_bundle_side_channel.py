"""Pin the prefill's Mooncake side-channel port, and bind its bootstrap server to the cluster address
(installed as sitecustomize for vLLM units only).

Why: vLLM's MooncakeConnector binds each prefill worker's ZMQ side channel with
bind_to_random_port, and every decode caches that address per remote engine_id for the life of
its process. A restarted prefill (rolling restart, crash) comes back on another random port, and
each decode then sends its pulls to the dead port until it is restarted itself: every request
routed through the restarted prefill fails after the pull timeout. With PD_BUNDLE_SIDE_CHANNEL_PORT
set, the worker binds the first free port from there (base + rank order), so the restarted prefill
answers on the address the decodes already know, and the firewall can name the ports.

Only the Mooncake connector calls bind_to_random_port in vLLM 0.32/0.33; a connector that no longer does (another
vLLM) would leave the pin silently inert, so its source is checked when vLLM imports it, and the engine refuses to
start with one line naming this patch and the vLLM version (refuse()). When every pinned port is
taken the bind fails (the worker, and so the unit, fails and systemd retries it): a random port would
lie outside the range the firewall opens, and decodes could never reach it.

The bootstrap server (VLLM_MOONCAKE_BOOTSTRAP_PORT, /register and /query without auth) is created with the
host "0.0.0.0" written in vLLM (MooncakeBootstrapServer("0.0.0.0", port)), and the prefill's own workers
register at 127.0.0.1 (get_mooncake_bootstrap_addr). With PD_BUNDLE_BOOTSTRAP_HOST set (the instance's
VLLM_HOST_IP, which decodes and routers use), both use that address instead, patched when vLLM imports the
connector (vLLM's own bootstrap_server_address setting cannot do it: it turns the server off). A connector
without those two names refuses to start the same way.
"""
import os
import sys


# patch_on_import, refuse_patch, vllm_version: defined above this file in sitecustomize.py (pd_bundle_import_hook.py);
# unit tests set them.

ENV = "PD_BUNDLE_SIDE_CHANNEL_PORT"
SPAN_ENV = "PD_BUNDLE_SIDE_CHANNEL_SPAN"
BOOTSTRAP_HOST_ENV = "PD_BUNDLE_BOOTSTRAP_HOST"
CONNECTOR = "vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector"
# What the patches need of the connector module: names it defines (CLASS.ATTR: an attribute of a class), and calls its
# source makes. scripts/conformance/conformance.py reads these lists in the source of each vLLM the inventory names.
SIDE_CHANNEL_TARGETS = {CONNECTOR: ("MooncakeBootstrapServer", "get_mooncake_bootstrap_addr")}
SIDE_CHANNEL_CALLS = {CONNECTOR: ("bind_to_random_port",)}
WILDCARDS = ("", "0.0.0.0", "::")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def pinned_ports(environ=os.environ):
    """The ports to try, in order, or [] when pinning is off or misconfigured."""
    try:
        base = int(environ.get(ENV, ""))
        span = int(environ.get(SPAN_ENV, "8"))
    except ValueError:
        return []
    if not 1024 <= base <= 65535 or span < 1:
        return []
    return list(range(base, min(base + span, 65536)))


def install(zmq_module=None, environ=os.environ):
    """Wrap Socket.bind_to_random_port; returns True when installed."""
    ports = pinned_ports(environ)
    if not ports:
        return False
    if zmq_module is None:
        try:
            import zmq as zmq_module  # noqa: PLC0415 - only when pinning is asked for
        except ImportError:
            return False
    original = zmq_module.Socket.bind_to_random_port

    def bind_to_random_port(self, addr, *args, **kwargs):
        for port in ports:
            try:
                self.bind("%s:%d" % (addr, port))
            except zmq_module.ZMQError:
                continue
            return port
        msg = ("pd-bundle: side-channel ports %d-%d are all taken; no random port instead, the firewall opens only "
               "these. Fix: free them (ss -tlnp 'sport >= :%d and sport <= :%d'), or move the instance's range "
               "(vllm_instances[].side_channel_port or vllm_side_channel_port_base) and re-run site.yml so the "
               "firewall follows." % (ports[0], ports[-1], ports[0], ports[-1]))
        print(msg, file=sys.stderr)
        raise getattr(zmq_module, "ZMQBindError", RuntimeError)(msg)

    zmq_module.Socket.bind_to_random_port = bind_to_random_port
    return True


def refuse(what):
    """The engine does not start: one line (stderr: the unit's journal) naming this patch, the vLLM version and the
    way out; then the exception."""
    refuse_patch("pd_bundle_side_channel", vllm_version(), what,
                 "run a vllm_version it was written for (docs/upgrading.md)")


def check_pinned_bind(module):
    """The connector module must still bind its side channel with bind_to_random_port (which install() pins)."""
    try:
        with open(module.__file__, encoding="utf-8") as f:
            source = f.read()
    except (AttributeError, TypeError, OSError):
        source = ""
    if "bind_to_random_port" not in source:
        refuse("%s no longer calls bind_to_random_port, so %s would pin nothing" % (module.__name__, ENV))


def patch_bootstrap(host):
    """The patch for vLLM's MooncakeConnector module: its bootstrap server binds host instead of the wildcard,
    and the workers register at host instead of loopback. Both, or the engine refuses to start (refuse())."""
    def patch(module):
        server, addr = getattr(module, "MooncakeBootstrapServer", None), getattr(module, "get_mooncake_bootstrap_addr", None)
        if server is None or addr is None:
            refuse("%s has no %s, which %s rebinds" % (
                module.__name__, " and no ".join(n for n, v in (("MooncakeBootstrapServer", server),
                                                               ("get_mooncake_bootstrap_addr", addr)) if v is None),
                BOOTSTRAP_HOST_ENV))

        class BootstrapServer(server):
            def __init__(self, bind, port, *args, **kwargs):
                super().__init__(host if bind in WILDCARDS else bind, port, *args, **kwargs)

        def bootstrap_addr(vllm_config):
            got, port = addr(vllm_config)
            return (host if got in LOOPBACK else got), port

        module.MooncakeBootstrapServer = BootstrapServer
        module.get_mooncake_bootstrap_addr = bootstrap_addr
    return patch


def install_bootstrap_bind(environ=os.environ):
    """Hook the connector's import when PD_BUNDLE_BOOTSTRAP_HOST is an address; returns True when hooked."""
    host = environ.get(BOOTSTRAP_HOST_ENV, "")
    if not host or host in WILDCARDS:
        return False
    patch_on_import(CONNECTOR, patch_bootstrap(host))
    return True


def install_bind_check(environ=os.environ):
    """Check the connector when vLLM imports it, where pinning is on; returns True when hooked."""
    if not pinned_ports(environ):
        return False
    patch_on_import(CONNECTOR, check_pinned_bind)
    return True


install()
install_bind_check()
install_bootstrap_bind()
