#!/usr/bin/env python3
"""mooncake-check: prove a Mooncake transfer path between two hosts works, and how fast.

  serve  target side: registers a zeroed buffer, answers on a plain TCP control port.
  probe  initiator: writes (or reads) pseudo-random bytes into the target's buffer with the
         transfer engine, checks sha256 on both ends, and compares with a raw TCP stream on the
         same pair, the two interleaved round by round; --min-ratio makes the ratio a floor.
  store  put/get round trip through mooncake_master (put on one host, get on another).

Host memory (the default) needs only the standard library and the mooncake wheel, so it runs in
/opt/mooncake/venv. --memory cuda registers GPU memory on --gpu instead, as vLLM's KV cache is
(GPU -> NIC -> NIC -> GPU); it needs torch and a CUDA build of the wheel: run it with the vLLM venv's python.
"""
import argparse
import ctypes
import hashlib
import json
import os
import random
import re
import socket
import statistics
import sys
import time


def parse_size(text):
    """'64MiB', '16mb', '1gb', '4096' -> bytes. Binary units throughout, like Mooncake's own '4gb'."""
    m = re.fullmatch(r"\s*(\d+)\s*(?:([kmgt])i?)?b?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"bad size: {text!r}")
    n = int(m.group(1)) << 10 * " kmgt".index((m.group(2) or " ").lower())
    if n <= 0:
        raise ValueError(f"size must be > 0: {text!r}")
    return n


def payload(seed, n):
    """Deterministic pseudo-random bytes, so a peer can rebuild the expected content from the seed."""
    return random.Random(seed).randbytes(n)


def sha256_hex(buf):
    return hashlib.sha256(memoryview(buf)).hexdigest()


def gbps(nbytes, seconds):
    return round(nbytes * 8 / seconds / 1e9, 3) if seconds > 0 else None


def build_result(source, target, protocol, nbytes, sha_src, sha_dst, mc_times, tcp_times, direction="write",
                 duration=None, min_ratio=0.0, device=(), hcas=(), gid_index=None, memory=("host", "host")):
    """The JSON document probe prints. mc_times/tcp_times: seconds of each full-buffer round per
    side, interleaved (tcp_times None: no baseline). *_gbps are Gbit/s over all rounds. ratio is the
    median over rounds of (raw TCP round time / the Mooncake round just before it): each pair ran
    under the same load, and the median ignores a burst that hit a few rounds; > 1: Mooncake beat
    raw TCP. floor_met is false when min_ratio > 0 and the ratio is below it (or unknown)."""
    rounds = len(mc_times)
    mc_s, tcp_s = sum(mc_times), None if tcp_times is None else sum(tcp_times)
    moved = nbytes * rounds
    pairs = [t / m for m, t in zip(mc_times, tcp_times or []) if m > 0]
    ratio = round(statistics.median(pairs), 3) if pairs else None
    return {"source": source, "target": target, "protocol": protocol, "direction": direction,
            "bytes": nbytes, "sha256": sha_src, "sha256_match": sha_src == sha_dst,
            "rounds": rounds, "bytes_moved": moved,
            "duration": None if duration is None else round(duration, 3),
            "mooncake_seconds": round(mc_s, 6), "mooncake_gbps": gbps(moved, mc_s),
            "tcp_seconds": None if tcp_s is None else round(tcp_s, 6),
            "tcp_gbps": None if tcp_s is None else gbps(moved, tcp_s),
            "ratio": ratio, "min_ratio": min_ratio,
            "floor_met": min_ratio <= 0 or (ratio is not None and ratio >= min_ratio),
            "device": list(device), "hcas": sorted(hcas), "gid_index": gid_index,
            "source_memory": memory[0], "target_memory": memory[1]}


def interleave(mooncake_round, tcp_round, duration, min_rounds, prepare=None, clock=time.perf_counter):
    """Run mooncake_round(r) and tcp_round(r) alternately (M,T,M,T,...), r = 1, 2, ..., so both
    see the same load, until at least min_rounds pairs ran and `duration` seconds passed. Each
    call moves one full buffer; tcp_round may be None (no baseline); prepare(r), if given, runs
    before each Mooncake round, untimed. Returns (Mooncake round seconds, TCP round seconds or
    None, wall seconds); only the transfers themselves are timed."""
    mc_times, tcp_times, start = [], [], clock()
    while len(mc_times) < min_rounds or clock() - start < duration:
        r = len(mc_times) + 1
        if prepare:
            prepare(r)
        t0 = clock()
        mooncake_round(r)
        t1 = clock()
        mc_times.append(t1 - t0)
        if tcp_round is not None:
            tcp_round(r)
            tcp_times.append(clock() - t1)
    return mc_times, tcp_times if tcp_round is not None else None, clock() - start


class Channel:
    """Line-delimited JSON over a stream socket; raw bytes may follow a line (tcp_sink)."""

    def __init__(self, sock):
        self.sock, self.buf = sock, b""

    def send(self, obj):
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self):
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("control connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)

    def recv_raw(self, n):
        """Read exactly n bytes (bytes already buffered after the JSON line count too)."""
        got, self.buf = len(self.buf[:n]), self.buf[n:]
        view = bytearray(1 << 20)
        while got < n:
            k = self.sock.recv_into(view, min(len(view), n - got))
            if not k:
                raise ConnectionError(f"tcp_sink: peer closed after {got} of {n} bytes")
            got += k
        return got


class Buffer:
    """Plain CPU memory (no numpy: the wheel does not depend on it), zeroed by ctypes.

    addr is the memory the engine registers and moves; mem (at host_addr) is what the check fills, stamps,
    sends over raw TCP and hashes. Here they are one buffer, so push and pull do nothing."""
    kind = "host"

    def __init__(self, n):
        self.mem, self.size = ctypes.create_string_buffer(n), n
        self.host_addr = self.addr = ctypes.addressof(self.mem)

    def register(self, engine):
        rc = engine.register_memory(self.addr, self.size)
        if rc != 0:  # -202 is usually memlock (LimitMEMLOCK=infinity); GPU memory: no GPUDirect path
            raise RuntimeError(f"register_memory({self.size}, {self.kind}) returned {rc}")
        return self

    def push(self):
        """The host copy -> the moved memory (after the check changed the host copy)."""

    def pull(self):
        """The moved memory -> the host copy (before the check reads it)."""

    def fill(self, data):
        ctypes.memmove(self.host_addr, data, len(data))
        self.push()


class GpuBuffer(Buffer):
    """GPU memory (where vLLM keeps KV) on one device, beside a host copy of the same size: the payload, the
    stamps and sha256 go through the host copy, copied in before each round and out after the transfers, both
    untimed. device allocates and copies: TorchCuda on a GPU host, a fake in unit tests."""

    def __init__(self, n, device):
        super().__init__(n)
        self.device, self.kind = device, device.name
        self.addr = device.alloc(n)
        self.push()  # zeroed, like host memory

    def push(self):
        self.device.copy_in(self.addr, self.host_addr, self.size)

    def pull(self):
        self.device.copy_out(self.host_addr, self.addr, self.size)


class TorchCuda:
    """GPU memory from torch (the vLLM venv's): one uint8 tensor per alloc; its data_ptr() is what the engine
    registers (the engine finds the GPU from the pointer). Host <-> GPU copies are synchronous."""

    def __init__(self, index):
        try:  # only on this path: the mooncake venv has no torch
            import torch
        except ImportError as e:
            raise RuntimeError(f"--memory cuda needs torch ({e}): run the check with the vLLM venv's python") from e
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise RuntimeError(f"--memory cuda --gpu {index}, but torch {torch.__version__} sees "
                               f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no'} CUDA device(s) "
                               f"(CUDA_VISIBLE_DEVICES={visible!r}): driver not loaded, or no such GPU")
        self.torch, self.name, self.tensors = torch, f"cuda:{index}", {}

    def alloc(self, n):
        t = self.torch.zeros(n, dtype=self.torch.uint8, device=self.name)
        self.tensors[t.data_ptr()] = t  # keep it alive while the engine holds the registration
        return t.data_ptr()

    def _host(self, addr, n):
        return self.torch.frombuffer((ctypes.c_char * n).from_address(addr), dtype=self.torch.uint8)

    def copy_in(self, dev_addr, host_addr, n):
        self.tensors[dev_addr][:n].copy_(self._host(host_addr, n))
        self.torch.cuda.synchronize(self.name)

    def copy_out(self, host_addr, dev_addr, n):
        self.torch.cuda.synchronize(self.name)
        self._host(host_addr, n).copy_(self.tensors[dev_addr][:n])


def make_buffer(a, gpu_device=TorchCuda):
    """The buffer the check moves: host memory, or --memory cuda on GPU --gpu (gpu_device(index): the
    allocator, injected by tests)."""
    if a.memory == "cuda":
        return GpuBuffer(a.size, gpu_device(a.gpu))
    return Buffer(a.size)


def topology_hcas(text):
    """RDMA device names in get_local_topology()'s JSON: {"cpu:0": [[preferred...], [available...]]}."""
    return {name for ranks in json.loads(text).values() for names in ranks for name in names}


def device_list(device):
    return [d for d in (device or "").split(",") if d]


def gid_index_env():
    """MC_GID_INDEX as the engine will read it (int), or None when the engine picks the GID."""
    value = os.environ.get("MC_GID_INDEX", "").strip()
    try:
        return int(value)
    except ValueError:
        return value or None


def make_engine(host_ip, protocol, device, memory="host"):
    """(engine, HCAs the engine's topology lists; empty for tcp)."""
    forced = os.environ.get("MC_FORCE_TCP", "").lower() not in ("", "0", "false", "no")
    if protocol == "tcp":  # else the engine still brings up RDMA where HCAs exist
        os.environ.setdefault("MC_FORCE_TCP", "1")
    elif forced:
        raise RuntimeError("--protocol rdma with MC_FORCE_TCP set: the engine would use TCP")
    import mooncake.engine as mc_engine
    # A non-CUDA wheel would treat the GPU pointer as host memory and fail (or fault) on it.
    if memory == "cuda" and getattr(mc_engine, "SUPPORT_CUDA", True) is False:
        raise RuntimeError(f"--memory cuda, but the mooncake wheel at {os.path.dirname(mc_engine.__file__)} is not a "
                           "CUDA build (SUPPORT_CUDA false): run the check with the vLLM venv's python")
    te = mc_engine.TransferEngine()
    rc = te.initialize(host_ip, "P2PHANDSHAKE", protocol, device or "")
    if rc != 0:
        raise RuntimeError(f"initialize({host_ip}, P2PHANDSHAKE, {protocol}) returned {rc}")
    hcas = set()
    if protocol == "rdma":  # with no HCA, initialize() returns 0 and transfers silently use TCP
        hcas = topology_hcas(te.get_local_topology())
        missing = set(device_list(device)) - hcas
        if not hcas:
            raise RuntimeError("--protocol rdma, but the engine found no RDMA device (would use TCP)")
        if missing:
            raise RuntimeError(f"--device {sorted(missing)} not among the engine's devices {sorted(hcas)}")
    return te, hcas


def log(msg):
    print(f"mooncake-check: {msg}", file=sys.stderr, flush=True)


def serve_session(ch, buf, hello):
    """Answer one control connection; True when the client said 'bye'."""
    ch.send(hello)
    while True:
        req = ch.recv()
        op = req.get("op")
        if op == "verify":
            buf.pull()
            ch.send({"sha256": sha256_hex(buf.mem)})
        elif op == "fill":  # for --read: content the probe can rebuild from the seed
            buf.fill(payload(req["seed"], buf.size))
            ch.send({"sha256": sha256_hex(buf.mem)})
        elif op == "tcp_sink":
            t0 = time.perf_counter()
            got = ch.recv_raw(int(req["bytes"]))
            ch.send({"bytes": got, "seconds": time.perf_counter() - t0})
        elif op == "bye":
            ch.send({"bye": True})
            return True
        else:
            ch.send({"error": f"unknown op {op!r}"})


def cmd_serve(a):
    te, hcas = make_engine(a.host_ip, a.protocol, a.device, a.memory)
    buf = make_buffer(a).register(te)
    hello = {"rpc_port": te.get_rpc_port(), "buffer_addr": buf.addr, "size": a.size, "protocol": a.protocol,
             "memory": buf.kind}
    lsock = socket.create_server((a.host_ip, a.control_port))
    deadline = time.monotonic() + a.timeout
    log(f"serving {hello} control {a.host_ip}:{a.control_port}, devices {sorted(hcas) or '-'}, "
        f"MC_GID_INDEX {gid_index_env()}, WITH_NVIDIA_PEERMEM {os.environ.get('WITH_NVIDIA_PEERMEM')}")
    while (left := deadline - time.monotonic()) > 0:
        lsock.settimeout(left)
        try:
            conn, peer = lsock.accept()
        except TimeoutError:
            continue
        with conn:  # one client at a time; a broken client does not end the serve
            conn.settimeout(max(1.0, deadline - time.monotonic()))
            try:
                if serve_session(Channel(conn), buf, hello):
                    return 0
            except (TimeoutError, ConnectionError, ValueError, KeyError, TypeError) as e:
                log(f"client {peer[0]}: {e}")
    log(f"timeout after {a.timeout}s without 'bye'")
    return 2


FLOOR_RC = 3  # sha256 matched, but Mooncake ran below --min-ratio of raw TCP
STAMP_STRIDE = 64 << 10  # the engine's default slice size: every slice of a write round is stamped


def cmd_probe(a):
    if a.min_ratio > 0 and a.no_tcp:
        raise ValueError("--min-ratio needs the raw TCP baseline (drop --no-tcp)")
    te, hcas = make_engine(a.host_ip, a.protocol, a.device, a.memory)
    sock = socket.create_connection((a.target, a.control_port), timeout=a.timeout)
    ch = Channel(sock)
    try:
        res = measure(a, te, ch, ch.recv(), hcas)
    finally:
        if not a.keep_target:  # release the target even when we fail: our exit code carries the verdict
            try:
                ch.sock.settimeout(10)  # a silent target must not hold up our verdict
                ch.send({"op": "bye"})
                ch.recv()
            except OSError:
                pass
    print(json.dumps(res) if a.json else "\n".join(f"{k:17} {v}" for k, v in res.items()))
    return verdict(res)


def verdict(res):
    """Exit code for a result: 0 good, 1 sha256 mismatch, FLOOR_RC below the ratio floor."""
    if not res["sha256_match"]:
        log("sha256 mismatch between source and destination buffer")
        return 1
    if not res["floor_met"]:
        log(f"ratio {res['ratio']} below the floor {res['min_ratio']}: Mooncake {res['mooncake_gbps']} Gb/s, "
            f"raw TCP {res['tcp_gbps']} Gb/s, {res['rounds']} interleaved rounds of {res['bytes']} bytes")
        return FLOOR_RC
    return 0


def measure(a, te, ch, hello, hcas=(), gpu_device=TorchCuda):
    if hello.get("protocol") != a.protocol:
        raise RuntimeError(f"protocol mismatch: target {hello.get('protocol')}, probe {a.protocol}")
    if a.size > hello["size"]:
        raise RuntimeError(f"--size {a.size} exceeds target buffer {hello['size']}")
    n, peer, direction = a.size, f"{a.target}:{hello['rpc_port']}", "read" if a.read else "write"
    buf = make_buffer(a, gpu_device).register(te)
    seed = int.from_bytes(os.urandom(8), "little")  # fresh per run: stale target data cannot match
    # Slices of at most --chunk bytes, sent as one batch.
    offs = list(range(0, n, a.chunk))
    srcs, dsts = [buf.addr + o for o in offs], [hello["buffer_addr"] + o for o in offs]
    lens = [min(a.chunk, n - o) for o in offs]
    if a.read:  # target fills its buffer from the seed, we pull it
        ch.send({"op": "fill", "seed": seed})
        want = ch.recv()["sha256"]
        xfer = te.batch_transfer_sync_read
    else:
        buf.fill(payload(seed, n))
        xfer = te.batch_transfer_sync_write

    stamps = range(0, n, STAMP_STRIDE)

    def prepare(r):
        """Make each round's bytes provable: a read lands in a zeroed buffer; a write carries the
        round number every STAMP_STRIDE bytes, so the final sha256 matches only the last round."""
        if a.read:
            ctypes.memset(buf.host_addr, 0, n)
        else:
            stamp = r.to_bytes(8, "little")
            for o in stamps:
                ctypes.memmove(buf.host_addr + o, stamp, min(8, n - o))
        buf.push()

    def mooncake_round(r):
        rc = xfer(peer, srcs, dsts, lens)
        if rc != 0:
            raise RuntimeError(f"batch_transfer_sync_{direction} to {peer} returned {rc} (round {r})")

    def tcp_round(_):  # raw TCP, same bytes, same pair, same control connection
        ch.send({"op": "tcp_sink", "bytes": n})
        ch.sock.sendall(memoryview(buf.mem))
        ch.recv()

    prepare(0)
    mooncake_round(0)  # warm-up, untimed: the first transfer also pays for the handshake
    mc_times, tcp_times, wall = interleave(mooncake_round, None if a.no_tcp else tcp_round,
                                           a.duration, a.iterations, prepare)
    if a.read:
        buf.pull()
        got = sha256_hex(buf.mem)
    else:  # the host copy holds what the last round pushed
        want = sha256_hex(buf.mem)
        ch.send({"op": "verify"})
        got = ch.recv()["sha256"]
    return build_result(a.host_ip, a.target, a.protocol, n, want, got, mc_times, tcp_times, direction,
                        duration=wall, min_ratio=a.min_ratio, device=device_list(a.device),
                        hcas=hcas, gid_index=gid_index_env(), memory=(buf.kind, hello.get("memory", "host")))


def put_with_retries(st, key, data, attempts, pause=2.0):
    """put, again after a failure: a master elected moments ago may refuse the first ones."""
    for attempt in range(1, attempts + 1):
        rc = st.put(key, data)
        if rc == 0:
            return
        log(f"put({key}) returned {rc} (attempt {attempt}/{attempts})")
        if attempt < attempts:
            time.sleep(pause)
    raise RuntimeError(f"put({key}) returned {rc} after {attempts} attempts")


def hold(st, key, seconds, step=0.5):
    """Stay up (the replica may live in this process's segment) until a getter removes the key.

    is_exist() is 1 (there), 0 (removed) or negative (an RPC error, e.g. during a master failover):
    only 0 ends the hold early; leaving on an error would drop the only replica before the get.
    """
    end = time.monotonic() + seconds
    while time.monotonic() < end and st.is_exist(key) != 0:
        time.sleep(step)


def get_checked(st, key, want, remove):
    """get and compare; remove the key only after a good read. A get that raced the put (the
    master answers replica_not_ready) must leave the key for the retry: removing it released the
    holding put side, and every retry then found nothing."""
    data = st.get(key)
    if not data:  # get() returns b"" for a missing key, or when the segment holding it is gone
        log(f"key {key!r} not found (did the put side exit before the get? use put --hold)")
    got = hashlib.sha256(data).hexdigest()
    ok = bool(data) and got == want
    if remove and ok:
        st.remove(key, True)  # force: the put side may still hold its lease
    return data, got, ok


def get_waiting(st, key, want, remove, wait, pause=1.0):
    """get_checked, again while the key is not there yet, up to `wait` seconds: the put side may still be
    setting up (a master elected moments ago). Retrying here, not in a new process, matters: every
    store client's close() costs about 30 s. Wrong content is a verdict at once."""
    end = time.monotonic() + wait
    while True:
        data, got, ok = get_checked(st, key, want, remove)
        if ok or data or time.monotonic() >= end:
            return data, got, ok
        time.sleep(pause)


def cmd_store(a):
    if a.protocol == "tcp":
        os.environ.setdefault("MC_FORCE_TCP", "1")
    from mooncake.store import MooncakeDistributedStore
    st = MooncakeDistributedStore()
    rc = st.setup(a.host_ip, a.metadata, a.segment_size, a.buffer_size, a.protocol, a.device or "", a.master)
    if rc != 0:
        raise RuntimeError(f"store setup (master {a.master}, metadata {a.metadata}) returned {rc}")
    try:
        if a.action == "put":
            data = payload(a.key, a.size)  # seeded by the key: get can rebuild it with --size
            put_with_retries(st, a.key, data, a.put_attempts)
            sha = hashlib.sha256(data).hexdigest()
            print(json.dumps({"key": a.key, "bytes": a.size, "sha256": sha}), flush=True)
            hold(st, a.key, a.hold)
            return 0
        if not (a.expect_sha256 or a.size):
            raise RuntimeError("get needs --expect-sha256 or --size")
        want = (a.expect_sha256 or hashlib.sha256(payload(a.key, a.size)).hexdigest()).lower()
        data, got, ok = get_waiting(st, a.key, want, a.remove, a.wait)
        print(json.dumps({"key": a.key, "bytes": len(data), "sha256": got, "sha256_match": got == want}))
        return 0 if ok else 1
    finally:
        st.close()


def build_parser():
    p = argparse.ArgumentParser(prog="mooncake-check", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def engine_opts(sp):
        sp.add_argument("--host-ip", required=True, help="this host's cluster-facing IP")
        sp.add_argument("--protocol", choices=["tcp", "rdma"], default="rdma")
        sp.add_argument("--device", default="", help="comma list of RDMA devices, e.g. mlx5_0,mlx5_1")

    def memory_opts(sp):
        sp.add_argument("--memory", choices=["host", "cuda"], default="host",
                        help="memory the engine moves: host, or GPU memory on --gpu (needs torch, a CUDA wheel)")
        sp.add_argument("--gpu", type=int, default=0,
                        help="CUDA device index for --memory cuda, as CUDA_VISIBLE_DEVICES numbers GPUs")

    s = sub.add_parser("serve", help="target side")
    engine_opts(s)
    memory_opts(s)
    s.add_argument("--size", type=parse_size, default="64MiB")
    s.add_argument("--control-port", type=int, default=18800)
    s.add_argument("--timeout", type=float, default=300, help="exit 2 if no 'bye' within this many seconds")
    s.set_defaults(fn=cmd_serve)

    r = sub.add_parser("probe", help="initiator side")
    engine_opts(r)
    memory_opts(r)
    r.add_argument("--target", required=True)
    r.add_argument("--control-port", type=int, default=18800)
    r.add_argument("--size", type=parse_size, default="64MiB")
    r.add_argument("--chunk", type=parse_size, default="16MiB", help="largest slice per transfer request")
    r.add_argument("--duration", type=float, default=4.0,
                   help="seconds of interleaved rounds (Mooncake, raw TCP, Mooncake, ...), each one full buffer")
    r.add_argument("--iterations", type=int, default=3, help="at least N rounds per side, however long they take")
    r.add_argument("--min-ratio", type=float, default=0.0,
                   help=f"floor for the ratio (median over rounds of raw TCP time / Mooncake time); "
                   f"below it exit {FLOOR_RC} (0: no floor)")
    r.add_argument("--read", action="store_true", help="test transfer_sync_read (target -> probe) instead")
    r.add_argument("--no-tcp", action="store_true", help="skip the raw TCP baseline")
    r.add_argument("--keep-target", action="store_true", help="do not send 'bye' to the target")
    r.add_argument("--timeout", type=float, default=120)
    r.add_argument("--json", action="store_true")
    r.set_defaults(fn=cmd_probe)

    t = sub.add_parser("store", help="store round trip through mooncake_master")
    engine_opts(t)
    t.add_argument("--master", required=True, help="H:50051")
    t.add_argument("--metadata", required=True, help="http://H:8080/metadata, etcd://H:2379 or P2PHANDSHAKE")
    t.add_argument("--segment-size", type=parse_size, default="128MiB", help="segment this client mounts")
    t.add_argument("--buffer-size", type=parse_size, default="128MiB", help="local transfer buffer")
    ta = t.add_subparsers(dest="action", required=True)
    put = ta.add_parser("put")
    put.add_argument("--key", required=True)
    put.add_argument("--size", type=parse_size, default="16MiB")
    put.add_argument("--hold", type=float, default=0, help="stay up (segment mounted) this many seconds, "
                     "or until a get --remove")
    put.add_argument("--put-attempts", type=int, default=5, help="tries of put, 2 s apart")
    get = ta.add_parser("get")
    get.add_argument("--key", required=True)
    get.add_argument("--expect-sha256")
    get.add_argument("--size", type=parse_size, help="rebuild the expected content from key and size")
    get.add_argument("--remove", action="store_true", help="remove the key after a good read (releases a holding put)")
    get.add_argument("--wait", type=float, default=0, help="retry a missing key this many seconds (1 s apart)")
    t.set_defaults(fn=cmd_store)
    return p


def main(argv=None):
    a = build_parser().parse_args(argv)
    try:
        return a.fn(a)
    except (RuntimeError, OSError, ValueError, KeyError, ImportError) as e:
        log(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
