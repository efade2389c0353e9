"""Unit tests for the pure parts of plugins/tools/mooncake_check.py.

The real transfers are exercised by tests/integration/test_mooncake_check_netns.py. These tests
cover size parsing, the result document and its floor, the interleaved rounds, the control protocol
over a real socket pair, and measure() against a fake engine that copies memory as a transfer would;
--memory cuda with a fake GPU allocator (no torch or CUDA needed) whose memory only its copies reach.
"""
import ctypes
import hashlib
import importlib.util
import json
import pathlib
import socket
import threading

import pytest

_PATH = pathlib.Path(__file__).resolve().parents[2] / "plugins" / "tools" / "mooncake_check.py"
_spec = importlib.util.spec_from_file_location("mooncake_check", _PATH)
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)


@pytest.mark.parametrize("text,expected", [
    ("64MiB", 64 << 20), ("16mb", 16 << 20), ("1gb", 1 << 30), ("4096", 4096), (4096, 4096),
    ("1 GiB", 1 << 30), ("512k", 512 << 10), ("2KB", 2048), ("7b", 7), ("1T", 1 << 40),
])
def test_parse_size(text, expected):
    assert mc.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "MiB", "-1", "1.5GiB", "12xb", "0", "0MiB", "1 2"])
def test_parse_size_rejects(text):
    with pytest.raises(ValueError):
        mc.parse_size(text)


def test_cli_rejects_bad_size():
    with pytest.raises(SystemExit) as e:
        mc.build_parser().parse_args(["probe", "--target", "x", "--host-ip", "y", "--size", "12xb"])
    assert e.value.code == 2


def test_cli_probe_floor_and_duration():
    a = mc.build_parser().parse_args(["probe", "--target", "x", "--host-ip", "y"])
    assert (a.duration, a.iterations, a.min_ratio) == (4.0, 3, 0.0)
    a = mc.build_parser().parse_args(["probe", "--target", "x", "--host-ip", "y", "--duration", "1.5",
                                      "--min-ratio", "0.25", "--device", "mlx5_0,mlx5_1"])
    assert (a.duration, a.min_ratio, mc.device_list(a.device)) == (1.5, 0.25, ["mlx5_0", "mlx5_1"])
    assert mc.device_list("") == [] and mc.device_list("rxe0,") == ["rxe0"]


def test_floor_without_baseline_is_refused(capsys):
    assert mc.main(["probe", "--target", "x", "--host-ip", "y", "--no-tcp", "--min-ratio", "0.5"]) == 1
    assert "--min-ratio needs the raw TCP baseline" in capsys.readouterr().err


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), ("3", 3), (" 1 ", 1), ("x", "x")])
def test_gid_index_from_env(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("MC_GID_INDEX", raising=False)
    else:
        monkeypatch.setenv("MC_GID_INDEX", value)
    assert mc.gid_index_env() == expected


def test_cli_defaults():
    a = mc.build_parser().parse_args(["serve", "--host-ip", "10.0.0.1"])
    assert (a.size, a.control_port, a.protocol, a.timeout) == (64 << 20, 18800, "rdma", 300)
    a = mc.build_parser().parse_args(["store", "--master", "h:50051", "--metadata", "P2PHANDSHAKE",
                                      "--host-ip", "h", "get", "--key", "k", "--size", "1mb"])
    assert (a.action, a.size, a.expect_sha256) == ("get", 1 << 20, None)


def test_payload_is_deterministic_and_seed_dependent():
    assert mc.payload(7, 1000) == mc.payload(7, 1000)
    assert mc.payload(7, 1000) != mc.payload(8, 1000)
    assert mc.payload("key", 1000) != mc.payload("key2", 1000)
    assert len(mc.payload(1, 3 << 20)) == 3 << 20


def test_build_result_ratio_and_match():
    n = 1 << 30
    r = mc.build_result("a", "b", "tcp", n, "s", "s", [1.0], [2.0])
    assert r["sha256_match"] is True
    assert r["mooncake_gbps"] == pytest.approx(8.59, abs=0.01)  # 2^30 bytes * 8 / 1 s in Gbit/s
    assert r["tcp_gbps"] == pytest.approx(4.295, abs=0.001)
    assert r["ratio"] == pytest.approx(2.0, abs=0.01)
    assert json.loads(json.dumps(r)) == r


def test_build_result_totals_over_rounds_and_floor():
    n = 1 << 30
    r = mc.build_result("a", "b", "rdma", n, "s", "s", [1.0, 1.0, 1.0, 1.0], [0.5, 0.5, 0.5, 0.5], duration=6.1,
                        min_ratio=0.5, device=["mlx5_0"], hcas={"mlx5_1", "mlx5_0"}, gid_index=3)
    assert (r["rounds"], r["bytes"], r["bytes_moved"]) == (4, n, 4 * n)
    assert r["mooncake_gbps"] == pytest.approx(8.59, abs=0.01)  # 4 GiB in 4 s
    assert r["ratio"] == pytest.approx(0.5, abs=0.001) and r["floor_met"] is True  # at the floor passes
    assert (r["device"], r["hcas"], r["gid_index"], r["duration"]) == (["mlx5_0"], ["mlx5_0", "mlx5_1"], 3, 6.1)
    low = mc.build_result("a", "b", "rdma", n, "s", "s", [1.0, 1.1, 1.0], [0.5, 0.5, 0.49], min_ratio=0.5)
    assert low["ratio"] == 0.49 and low["floor_met"] is False
    assert mc.build_result("a", "b", "tcp", n, "s", "s", [40.0], [2.0])["floor_met"] is True  # 0: no floor
    # A floor with no baseline cannot be met.
    assert mc.build_result("a", "b", "tcp", n, "s", "s", [1.0], None, min_ratio=0.1)["floor_met"] is False


def test_ratio_is_the_median_of_round_pairs_so_a_burst_does_not_decide_it():
    # Rounds 2 and 3: a load burst slowed Mooncake (10 s); totals alone would say 0.09.
    r = mc.build_result("a", "b", "tcp", 1 << 30, "s", "s", [1.0, 10.0, 10.0, 1.0, 1.0], [1.0] * 5, min_ratio=0.5)
    assert r["tcp_seconds"] / r["mooncake_seconds"] == pytest.approx(0.217, abs=0.001)
    assert r["ratio"] == 1.0 and r["floor_met"] is True
    # ... but a Mooncake path slow in most rounds fails
    r = mc.build_result("a", "b", "tcp", 1 << 30, "s", "s", [1.0, 10.0, 10.0, 10.0, 1.0], [1.0] * 5, min_ratio=0.5)
    assert r["ratio"] == 0.1 and r["floor_met"] is False


def test_verdict_exit_codes(capsys):
    ok = mc.build_result("a", "b", "tcp", 100, "s", "s", [1.0], [1.0], min_ratio=0.5)  # 0.0 Gb/s each, ratio 1
    assert mc.verdict(ok) == 0
    low = mc.build_result("a", "b", "tcp", 100, "s", "s", [3.0], [1.0], min_ratio=0.5)
    assert mc.verdict(low) == mc.FLOOR_RC == 3
    assert "ratio 0.333 below the floor 0.5" in capsys.readouterr().err
    bad = mc.build_result("a", "b", "tcp", 100, "s", "t", [3.0], [1.0], min_ratio=0.5)
    assert mc.verdict(bad) == 1  # a mismatch outranks the floor


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_interleave_alternates_until_duration_and_times_only_transfers():
    clock, calls = _Clock(), []

    def mooncake(r):
        calls.append(("M", r))
        clock.now += 0.5

    def tcp(r):
        calls.append(("T", r))
        clock.now += 0.25

    def prepare(r):
        calls.append(("P", r))
        clock.now += 10.0  # untimed, but it counts towards the duration

    mc_t, tcp_t, wall = mc.interleave(mooncake, tcp, 2.0, 1, clock=clock)
    assert calls == [("M", 1), ("T", 1), ("M", 2), ("T", 2), ("M", 3), ("T", 3)]  # 0.75 s per pair
    assert (mc_t, tcp_t, wall) == ([0.5] * 3, [0.25] * 3, 2.25)
    calls.clear()
    mc_t, tcp_t, wall = mc.interleave(mooncake, tcp, 1.0, 2, prepare=prepare, clock=clock)
    assert calls == [("P", 1), ("M", 1), ("T", 1), ("P", 2), ("M", 2), ("T", 2)]  # min_rounds beats duration
    assert (mc_t, tcp_t) == ([0.5] * 2, [0.25] * 2) and wall == pytest.approx(21.5)


def test_interleave_without_baseline():
    clock = _Clock()
    mc_t, tcp_t, _ = mc.interleave(lambda r: setattr(clock, "now", clock.now + 1), None, 0, 3, clock=clock)
    assert (mc_t, tcp_t) == ([1.0] * 3, None)


def test_build_result_mismatch_and_no_baseline():
    r = mc.build_result("a", "b", "rdma", 100, "s1", "s2", [0.5], None, "read")
    assert r["sha256_match"] is False
    assert r["tcp_gbps"] is None and r["ratio"] is None and r["direction"] == "read"


def test_topology_hcas():
    # Exactly what the 0.3.13.post1 wheel returned on a host without RDMA devices.
    assert mc.topology_hcas('{\n\t"cpu:0" : \n\t[\n\t\t[],\n\t\t[]\n\t]\n}\n') == set()
    topo = '{"cpu:0": [["mlx5_0"], ["mlx5_1"]], "cpu:1": [["mlx5_1"], []], "cuda:0": [["mlx5_2"], []]}'
    assert mc.topology_hcas(topo) == {"mlx5_0", "mlx5_1", "mlx5_2"}


def test_rdma_refused_when_tcp_forced(monkeypatch):
    # Checked before the engine is imported, so this needs no wheel.
    monkeypatch.setenv("MC_FORCE_TCP", "true")
    with pytest.raises(RuntimeError, match="MC_FORCE_TCP"):
        mc.make_engine("10.0.0.1", "rdma", "")


def test_sha256_of_buffer_matches_hashlib():
    buf = mc.Buffer(1 << 16)
    assert mc.sha256_hex(buf.mem) == hashlib.sha256(bytes(1 << 16)).hexdigest()  # starts zeroed
    data = mc.payload(3, 1 << 16)
    buf.fill(data)
    assert mc.sha256_hex(buf.mem) == hashlib.sha256(data).hexdigest()


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    yield a, b
    a.close()
    b.close()


def test_channel_framing_split_and_coalesced(pair):
    a, b = pair
    ch = mc.Channel(b)
    a.sendall(b'{"op": "ver')  # a message split over two segments
    a.sendall(b'ify"}\n{"op": "bye"}\n')  # ... and two messages in one segment
    assert ch.recv() == {"op": "verify"}
    assert ch.recv() == {"op": "bye"}
    mc.Channel(a).send({"x": 1})
    assert b.recv(100) == b'{"x": 1}\n'


def test_channel_raw_bytes_after_line(pair):
    a, b = pair
    ch = mc.Channel(b)
    blob = mc.payload(5, 3 << 20)
    # The raw bytes start in the same segment as the JSON line: they must be counted too.
    t = threading.Thread(target=lambda: a.sendall(b'{"op": "tcp_sink"}\n' + blob + b'{"op": "bye"}\n'))
    t.start()
    assert ch.recv() == {"op": "tcp_sink"}
    assert ch.recv_raw(len(blob)) == len(blob)
    assert ch.recv() == {"op": "bye"}
    t.join()


def test_channel_peer_closed(pair):
    a, b = pair
    ch = mc.Channel(b)
    a.sendall(b'{"op": "tcp_sink"}\n' + b"x" * 10)
    a.close()
    assert ch.recv() == {"op": "tcp_sink"}
    with pytest.raises(ConnectionError, match="after 10 of 100 bytes"):
        ch.recv_raw(100)
    with pytest.raises(ConnectionError):
        ch.recv()


def test_serve_session_protocol(pair):
    """Drive the target's control loop over a socket pair with a plain (unregistered) buffer."""
    a, b = pair
    size = 1 << 20
    buf = mc.Buffer(size)
    hello = {"rpc_port": 15001, "buffer_addr": buf.addr, "size": size, "protocol": "tcp"}
    out = {}
    t = threading.Thread(target=lambda: out.update(bye=mc.serve_session(mc.Channel(b), buf, hello)))
    t.start()
    cli = mc.Channel(a)
    assert cli.recv() == hello
    cli.send({"op": "verify"})
    assert cli.recv()["sha256"] == hashlib.sha256(bytes(size)).hexdigest()
    cli.send({"op": "fill", "seed": 42})
    assert cli.recv()["sha256"] == hashlib.sha256(mc.payload(42, size)).hexdigest()
    cli.send({"op": "verify"})  # verify reports what the buffer holds now
    assert cli.recv()["sha256"] == hashlib.sha256(mc.payload(42, size)).hexdigest()
    cli.send({"op": "tcp_sink", "bytes": 2 << 20})
    a.sendall(mc.payload(1, 2 << 20))
    r = cli.recv()
    assert r["bytes"] == 2 << 20 and r["seconds"] >= 0
    cli.send({"op": "nope"})
    assert "unknown op" in cli.recv()["error"]
    cli.send({"op": "bye"})
    assert cli.recv() == {"bye": True}
    t.join(10)
    assert out == {"bye": True}


def test_serve_session_ends_without_bye_when_client_leaves(pair):
    a, b = pair
    buf = mc.Buffer(16)
    errs = []

    def run():
        try:
            mc.serve_session(mc.Channel(b), buf, {"size": 16})
        except ConnectionError as e:
            errs.append(e)

    t = threading.Thread(target=run)
    t.start()
    assert mc.Channel(a).recv() == {"size": 16}
    a.close()
    t.join(10)
    assert len(errs) == 1


class _FakeStore:
    """Stands in for MooncakeDistributedStore: scripted put() return codes and is_exist() answers."""

    def __init__(self, puts=(), exists=(), gets=()):
        self.puts, self.exists, self.gets, self.calls, self.removed = list(puts), list(exists), list(gets), 0, []

    def get(self, key):
        return self.gets.pop(0)

    def remove(self, key, force=False):
        self.removed.append(key)

    def put(self, key, data):
        self.calls += 1
        return self.puts.pop(0)

    def is_exist(self, key):
        return self.exists.pop(0) if self.exists else 0


def test_put_retries_until_the_master_accepts():
    st = _FakeStore(puts=[-706, -1, 0])
    mc.put_with_retries(st, "k", b"x", 5, pause=0)
    assert st.calls == 3


def test_put_gives_up_after_its_attempts():
    st = _FakeStore(puts=[-1, -1])
    with pytest.raises(RuntimeError, match="after 2 attempts"):
        mc.put_with_retries(st, "k", b"x", 2, pause=0)


def test_hold_survives_rpc_errors_and_ends_when_removed():
    st = _FakeStore(exists=[1, -1, -800, 1, 0, 1])
    mc.hold(st, "k", 60, step=0)
    assert st.exists == [1]  # stopped at the first 0 (removed), not at the errors before it


def test_get_removes_the_key_only_after_a_good_read():
    data = mc.payload("k", 1000)
    want = hashlib.sha256(data).hexdigest()
    st = _FakeStore(gets=[b"", data])
    assert mc.get_checked(st, "k", want, True)[2] is False and st.removed == []  # raced the put: keep it
    assert mc.get_checked(st, "k", want, True)[2] is True and st.removed == ["k"]
    st = _FakeStore(gets=[b"x" * 1000])
    assert mc.get_checked(st, "k", want, True)[2] is False and st.removed == []  # wrong content: keep it


class _FakeEngine:
    """Stands in for TransferEngine in measure(): a 'transfer' is a memmove between two buffers of this
    process; skip=(round, slice) leaves one slice of one round undelivered."""

    def __init__(self, skip=None):
        self.calls, self.skip = 0, skip

    def register_memory(self, addr, n):
        return 0

    def _copy(self, srcs, dsts, lens):
        for i, (s, d, n) in enumerate(zip(srcs, dsts, lens)):
            if self.skip != (self.calls, i):
                ctypes.memmove(d, s, n)
        self.calls += 1
        return 0

    def batch_transfer_sync_write(self, peer, srcs, dsts, lens):
        return self._copy(srcs, dsts, lens)

    def batch_transfer_sync_read(self, peer, srcs, dsts, lens):
        return self._copy(dsts, srcs, lens)  # read: from the peer's (dst) addresses into ours


def _measure(pair, engine, read=False, min_ratio=0.0, size=1 << 20, gpu=False):
    """One probe against serve_session over the socket pair. Host memory over tcp on device d0; gpu=True: both
    ends in fake GPU memory over rdma (probe cuda:2, target cuda:1), so the target's device buffer is what the
    engine's transfers address. A host target's hello names no memory: the probe takes it as host."""
    a, b = pair
    protocol = "rdma" if gpu else "tcp"
    target = mc.GpuBuffer(size, _FakeGpu(1)) if gpu else mc.Buffer(size)
    hello = {"rpc_port": 15001, "buffer_addr": target.addr, "size": size, "protocol": protocol}
    if gpu:
        hello["memory"] = target.kind
    t = threading.Thread(target=mc.serve_session, args=(mc.Channel(b), target, hello), daemon=True)
    t.start()
    ch = mc.Channel(a)
    args = mc.build_parser().parse_args(["probe", "--target", "127.0.0.1", "--host-ip", "127.0.0.1", "--protocol",
                                         protocol, "--size", str(size), "--chunk", str(size // 4), "--duration", "0",
                                         "--iterations", "3", "--min-ratio", str(min_ratio)]
                                        + (["--memory", "cuda", "--gpu", "2"] if gpu else ["--device", "d0"])
                                        + (["--read"] if read else []))
    res = mc.measure(args, engine, ch, ch.recv(), {"mlx5_0"} if gpu else {"d0"}, gpu_device=_FakeGpu)
    ch.send({"op": "bye"})
    ch.recv()
    t.join(10)
    return res



@pytest.mark.parametrize("read", [False, True])
def test_measure_interleaves_and_checks_every_round(pair, read):
    eng = _FakeEngine()
    res = _measure(pair, eng, read=read)
    assert res["sha256_match"] is True and res["direction"] == ("read" if read else "write")
    assert res["rounds"] == 3 and eng.calls == 4  # a warm-up, then 3 timed rounds
    assert res["bytes_moved"] == 3 << 20 and res["tcp_gbps"] > 0 and res["ratio"] is not None
    assert (res["device"], res["hcas"], res["floor_met"]) == (["d0"], ["d0"], True)


@pytest.mark.parametrize("read", [False, True])
def test_measure_catches_a_slice_missing_from_the_last_round(pair, read):
    # Earlier rounds delivered that slice: only the per-round stamp (write) or zeroing (read) shows it.
    res = _measure(pair, _FakeEngine(skip=(3, 2)), read=read)
    assert res["sha256_match"] is False and mc.verdict(res) == 1


def test_measure_below_the_floor_fails(pair):
    res = _measure(pair, _FakeEngine(), min_ratio=1e6)  # no transfer beats raw TCP a million times
    assert res["sha256_match"] is True and res["floor_met"] is False
    assert mc.verdict(res) == mc.FLOOR_RC


def test_get_waits_for_a_missing_key_but_not_for_wrong_content():
    data = b"y" * 1000
    want = hashlib.sha256(data).hexdigest()
    st = _FakeStore(gets=[b"", b"", data])
    assert mc.get_waiting(st, "k", want, True, wait=10, pause=0)[2] is True and st.removed == ["k"]
    st = _FakeStore(gets=[b"", b"x" * 1000, data])
    assert mc.get_waiting(st, "k", want, True, wait=10, pause=0)[2] is False  # wrong content: no retry
    st = _FakeStore(gets=[b""] * 50)
    assert mc.get_waiting(st, "k", want, True, wait=0, pause=0)[2] is False  # no wait: one try


class _FakeGpu:
    """Stands in for TorchCuda: 'GPU memory' is a separate host buffer, reachable only through copy_in/copy_out
    (as cudaMemcpy would be), so a path that read or wrote the host copy instead would fail the checksum."""

    def __init__(self, index):
        self.name, self.mem, self.copies = "cuda:%d" % index, [], []

    def alloc(self, n):
        self.mem.append(ctypes.create_string_buffer(n))
        return ctypes.addressof(self.mem[-1])

    def copy_in(self, dev, host, n):
        self.copies.append("in")
        ctypes.memmove(dev, host, n)

    def copy_out(self, host, dev, n):
        self.copies.append("out")
        ctypes.memmove(host, dev, n)


def test_cli_memory_kind_defaults_to_host():
    for cmd in (["serve"], ["probe", "--target", "x"]):
        a = mc.build_parser().parse_args(cmd + ["--host-ip", "y"])
        assert (a.memory, a.gpu) == ("host", 0)
    a = mc.build_parser().parse_args(["serve", "--host-ip", "y", "--memory", "cuda", "--gpu", "3"])
    assert (a.memory, a.gpu) == ("cuda", 3)
    with pytest.raises(SystemExit):
        mc.build_parser().parse_args(["serve", "--host-ip", "y", "--memory", "vram"])


def test_make_buffer_selects_the_memory_kind():
    made = []

    def gpu(index):
        made.append(_FakeGpu(index))
        return made[-1]

    host = mc.make_buffer(mc.build_parser().parse_args(["serve", "--host-ip", "y", "--size", "4096"]), gpu)
    assert (type(host), host.kind, host.addr == host.host_addr, made) == (mc.Buffer, "host", True, [])
    cuda = mc.make_buffer(mc.build_parser().parse_args(["serve", "--host-ip", "y", "--size", "4096", "--memory", "cuda",
                                                        "--gpu", "5"]), gpu)
    assert (type(cuda), cuda.kind, cuda.size) == (mc.GpuBuffer, "cuda:5", 4096)
    # the engine gets the device address, not the host copy; the device starts zeroed
    assert cuda.addr == ctypes.addressof(made[0].mem[0]) != cuda.host_addr and made[0].copies == ["in"]


def test_gpu_buffer_fill_and_verify_go_through_the_device(pair):
    a, b = pair
    buf = mc.GpuBuffer(1 << 16, _FakeGpu(0))
    hello = {"rpc_port": 15001, "buffer_addr": buf.addr, "size": 1 << 16, "protocol": "tcp", "memory": buf.kind}
    t = threading.Thread(target=mc.serve_session, args=(mc.Channel(b), buf, hello), daemon=True)
    t.start()
    cli = mc.Channel(a)
    assert cli.recv()["memory"] == "cuda:0"
    cli.send({"op": "fill", "seed": 9})
    assert cli.recv()["sha256"] == hashlib.sha256(mc.payload(9, 1 << 16)).hexdigest()
    assert ctypes.string_at(buf.addr, 1 << 16) == mc.payload(9, 1 << 16)  # it reached the device
    ctypes.memset(buf.addr, 7, 1 << 16)  # a transfer lands in device memory only
    cli.send({"op": "verify"})  # verify hashes what the device holds, not the stale host copy
    assert cli.recv()["sha256"] == hashlib.sha256(b"\x07" * (1 << 16)).hexdigest()
    cli.send({"op": "bye"})
    cli.recv()
    t.join(10)


@pytest.mark.parametrize("read", [False, True])
def test_measure_gpu_to_gpu(pair, read):
    res = _measure(pair, _FakeEngine(), read=read, gpu=True)
    assert res["sha256_match"] is True and res["rounds"] == 3
    assert (res["source_memory"], res["target_memory"]) == ("cuda:2", "cuda:1")


@pytest.mark.parametrize("read", [False, True])
def test_measure_gpu_catches_a_slice_missing_from_the_last_round(pair, read):
    # The per-round stamp (write) or zeroing (read) must reach device memory, or this would pass.
    res = _measure(pair, _FakeEngine(skip=(3, 2)), read=read, gpu=True)
    assert res["sha256_match"] is False and mc.verdict(res) == 1


def test_host_memory_result_says_host(pair):
    res = _measure(pair, _FakeEngine())
    assert (res["source_memory"], res["target_memory"]) == ("host", "host")


def test_cuda_memory_refuses_a_non_cuda_wheel(monkeypatch, capsys):
    import sys
    import types
    fake = types.ModuleType("mooncake.engine")
    fake.SUPPORT_CUDA, fake.__file__ = False, "/opt/mooncake/venv/lib/mooncake/engine.so"
    fake.TransferEngine = lambda: pytest.fail("the engine must not start")
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # restored afterwards (make_engine sets it for tcp)
    monkeypatch.setitem(sys.modules, "mooncake", types.ModuleType("mooncake"))
    monkeypatch.setitem(sys.modules, "mooncake.engine", fake)
    sys.modules["mooncake"].engine = fake
    assert mc.main(["serve", "--host-ip", "127.0.0.1", "--protocol", "tcp", "--memory", "cuda"]) == 1
    assert "not a CUDA build" in capsys.readouterr().err


def test_cuda_memory_without_torch_says_which_python(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(RuntimeError, match="vLLM venv's python"):
        mc.TorchCuda(0)
