"""The side-channel pin: a restarted prefill binds the same port, so decodes' cached address works."""
import sys
import types

import pytest

from conftest import load_patch

sc = load_patch("pd_bundle_side_channel")


class FakeZmq:
    """A socket namespace where some ports are taken (recorded binds, no network)."""

    class ZMQError(Exception):
        pass

    taken = set()

    class Socket:
        def __init__(self):
            self.bound = []

        def bind(self, addr):
            port = int(addr.rsplit(":", 1)[1])
            if port in FakeZmq.taken:
                raise FakeZmq.ZMQError("Address already in use")
            FakeZmq.taken.add(port)
            self.bound.append(addr)

        def bind_to_random_port(self, addr, min_port=49152, max_port=65536, max_tries=100):
            self.bind("%s:%d" % (addr, 55555))
            return 55555


def fresh_zmq():
    class Z(FakeZmq):
        taken = set()

        class Socket(FakeZmq.Socket):
            pass
    FakeZmq.taken = Z.taken
    return Z


def test_off_without_the_variable():
    assert sc.pinned_ports({}) == []
    assert sc.install(fresh_zmq(), {}) is False


def test_bad_values_leave_pyzmq_alone():
    assert sc.pinned_ports({sc.ENV: "abc"}) == []
    assert sc.pinned_ports({sc.ENV: "80"}) == []
    assert sc.pinned_ports({sc.ENV: "9000", sc.SPAN_ENV: "0"}) == []


def test_range_is_capped_at_65535():
    assert sc.pinned_ports({sc.ENV: "65534", sc.SPAN_ENV: "8"}) == [65534, 65535]


def test_same_port_after_a_restart():
    z = fresh_zmq()
    assert sc.install(z, {sc.ENV: "9100", sc.SPAN_ENV: "4"})
    first = z.Socket().bind_to_random_port("tcp://10.0.0.1")
    assert first == 9100
    FakeZmq.taken.discard(first)  # the process died: its port is free again
    assert z.Socket().bind_to_random_port("tcp://10.0.0.1") == 9100


def test_second_rank_takes_the_next_port_and_a_full_range_fails():
    """Never a random port: it would lie outside the range the firewall opens."""
    z = fresh_zmq()
    sc.install(z, {sc.ENV: "9100", sc.SPAN_ENV: "2"})
    assert [z.Socket().bind_to_random_port("tcp://h") for _ in range(2)] == [9100, 9101]
    with pytest.raises(RuntimeError, match="9100-9101 are all taken.*vllm_side_channel_port_base"):
        z.Socket().bind_to_random_port("tcp://h")
    assert 55555 not in FakeZmq.taken  # pyzmq's own random choice was never made


class FakeServer:
    def __init__(self, host, port):
        self.host, self.port = host, port


def fake_connector(loopback="127.0.0.1"):
    """The two names of vLLM's mooncake_connector module the bootstrap patch replaces."""
    return types.SimpleNamespace(MooncakeBootstrapServer=FakeServer,
                                 get_mooncake_bootstrap_addr=lambda cfg: (cfg.get("host", loopback), 8998))


def test_bootstrap_server_binds_and_registers_at_the_instance_address():
    mod = fake_connector()
    sc.patch_bootstrap("10.10.1.21")(mod)
    server = mod.MooncakeBootstrapServer("0.0.0.0", 8998)
    assert (server.host, server.port) == ("10.10.1.21", 8998) and isinstance(server, FakeServer)
    assert mod.MooncakeBootstrapServer("10.9.9.9", 8998).host == "10.9.9.9"  # an explicit address stays
    assert mod.get_mooncake_bootstrap_addr({}) == ("10.10.1.21", 8998)  # the workers' registration
    assert mod.get_mooncake_bootstrap_addr({"host": "10.0.0.5"}) == ("10.0.0.5", 8998)  # multi-node master stays


def test_bootstrap_patch_refuses_a_connector_without_its_names(capsys):
    mod = types.SimpleNamespace(MooncakeBootstrapServer=FakeServer, __name__="vllm.x.mooncake_connector")
    with pytest.raises(RuntimeError, match="patch pd_bundle_side_channel does not fit vLLM"):
        sc.patch_bootstrap("10.10.1.21")(mod)  # another vLLM: no address function
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and "get_mooncake_bootstrap_addr" in line and "docs/upgrading.md" in line
    assert mod.MooncakeBootstrapServer is FakeServer


def test_pinning_refuses_a_connector_that_no_longer_binds_a_random_port(tmp_path, capsys):
    old, new = tmp_path / "old.py", tmp_path / "new.py"
    old.write_text("sock.bind_to_random_port(addr)\n")
    new.write_text("sock.bind(addr)\n")
    sc.check_pinned_bind(types.SimpleNamespace(__file__=str(old), __name__="c"))  # the connector it was written for
    with pytest.raises(RuntimeError, match="no longer calls bind_to_random_port"):
        sc.check_pinned_bind(types.SimpleNamespace(__file__=str(new), __name__="c"))
    assert "pd_bundle_side_channel" in capsys.readouterr().err


def test_bind_check_hooks_only_where_pinning_is_on():
    before = list(sys.meta_path)
    assert not sc.install_bind_check({})
    assert sys.meta_path == before
    assert sc.install_bind_check({"PD_BUNDLE_SIDE_CHANNEL_PORT": "5600"})
    finder = sys.meta_path[0]
    assert finder.name == sc.CONNECTOR
    sys.meta_path.remove(finder)


def test_bootstrap_patch_hooks_the_connector_import(tmp_path, monkeypatch):
    pkg = tmp_path / "fakevllm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "conn.py").write_text("class MooncakeBootstrapServer:\n"
                                 "    def __init__(self, host, port):\n        self.host = host\n"
                                 "def get_mooncake_bootstrap_addr(cfg):\n    return '127.0.0.1', 8998\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sc, "CONNECTOR", "fakevllm.conn")
    assert sc.install_bootstrap_bind({"PD_BUNDLE_BOOTSTRAP_HOST": "10.10.1.21"})
    import fakevllm.conn as conn  # noqa: PLC0415
    assert conn.MooncakeBootstrapServer("0.0.0.0", 8998).host == "10.10.1.21"
    assert conn.get_mooncake_bootstrap_addr(None) == ("10.10.1.21", 8998)


@pytest.mark.parametrize("env", [{}, {"PD_BUNDLE_BOOTSTRAP_HOST": ""}, {"PD_BUNDLE_BOOTSTRAP_HOST": "0.0.0.0"}])
def test_bootstrap_bind_off_without_an_address(env):
    before = list(sys.meta_path)
    assert not sc.install_bootstrap_bind(env)
    assert sys.meta_path == before
