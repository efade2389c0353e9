"""plugins/tools/pd_bundle_amx.py: a vLLM process asks the kernel for AMX tile state where the CPU has AMX (vLLM's
CPU attention uses AMX without asking; the worker died with SIGILL on the lab), and says so when the kernel refuses."""
import importlib.util
import platform
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "plugins" / "tools" / "pd_bundle_amx.py"
spec = importlib.util.spec_from_file_location("pd_bundle_amx", SRC)
amx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(amx)

X86_LINUX = platform.system() == "Linux" and platform.machine() == "x86_64"


class RecordedLibc:
    """Records the syscall and answers as the kernel would (0: granted, -1: refused)."""

    def __init__(self, rc):
        self.rc, self.calls = rc, []

    def syscall(self, *args):
        self.calls.append(args)
        return self.rc


def cpuinfo(tmp_path, flags):
    p = tmp_path / "cpuinfo"
    p.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx512f %s\n\nprocessor\t: 1\n" % flags)
    return str(p)


def test_no_amx_asks_nothing(tmp_path):
    libc = RecordedLibc(0)
    assert amx.request_amx(cpuinfo(tmp_path, "avx512_bf16"), libc) is False
    assert libc.calls == []


@pytest.mark.skipif(not X86_LINUX, reason="arch_prctl is x86_64 Linux")
def test_amx_asks_for_tile_data(tmp_path):
    libc = RecordedLibc(0)
    assert amx.request_amx(cpuinfo(tmp_path, "amx_bf16 amx_tile amx_int8"), libc) is True
    assert libc.calls == [(158, 0x1023, 18)]  # arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)


@pytest.mark.skipif(not X86_LINUX, reason="arch_prctl is x86_64 Linux")
def test_a_refusal_is_said(tmp_path, capsys):
    assert amx.request_amx(cpuinfo(tmp_path, "amx_tile"), RecordedLibc(-1)) is False
    assert "refused AMX tile data" in capsys.readouterr().err


def test_missing_cpuinfo_is_no_amx(tmp_path):
    assert amx.cpu_has_amx(str(tmp_path / "absent")) is False
