"""Intel AMX: ask the kernel for the tile data state before vLLM's CPU kernels use it.

Why: Linux hands a process the AMX tile state (XTILEDATA) only after arch_prctl(ARCH_REQ_XCOMP_PERM); a process
that runs an AMX instruction without it dies with SIGILL. vLLM 0.32's CPU attention picks its AMX kernel
whenever torch reports AMX (torch.cpu._is_amx_tile_supported(): the CPU flag only) and never asks for the
permission; it works only once oneDNN has asked for it in a large bf16 matmul. A decode whose first step is the
one token after a KV transfer runs the AMX attention first and its worker dies (exit code -4). Seen on the lab on
a host whose CPU has AMX ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)" at the first request
a fresh decode got by transfer; the CI machines of earlier runs had no AMX). The request is the kernel's
public interface (Documentation/arch/x86/xstate.rst), harmless where AMX is absent (nothing is asked) and
idempotent. Upstream: vLLM's CPU worker would call torch._C._cpu._init_amx() (or arch_prctl) at start; that change
retires this file.
"""
import ctypes
import platform
import sys

AMX_ARCH_REQ_XCOMP_PERM = 0x1023
AMX_XFEATURE_XTILEDATA = 18
AMX_SYS_ARCH_PRCTL = 158  # x86_64


def cpu_has_amx(cpuinfo="/proc/cpuinfo"):
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        return False
    return False


def request_amx(cpuinfo="/proc/cpuinfo", libc=None):
    """True when the permission was asked for and granted, False where there is no AMX; warns on a refusal."""
    if platform.system() != "Linux" or platform.machine() != "x86_64" or not cpu_has_amx(cpuinfo):
        return False
    libc = libc or ctypes.CDLL(None, use_errno=True)
    if libc.syscall(AMX_SYS_ARCH_PRCTL, AMX_ARCH_REQ_XCOMP_PERM, AMX_XFEATURE_XTILEDATA) != 0:
        sys.stderr.write("pd-bundle: the kernel refused AMX tile data (arch_prctl errno %d): vLLM's AMX kernels "
                         "will fail with SIGILL on this host\n" % ctypes.get_errno())
        return False
    return True


# In sitecustomize.py (every process of a vLLM unit, the engine's workers too); a unit test imports it by name.
if __name__ != "pd_bundle_amx":
    request_amx()
