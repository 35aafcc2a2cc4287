"""What this CPU is: its model name and ISA flags as Linux's /proc/cpuinfo names them.

Read by the int8 ONNX path, the lean int8 path's dispatch (`qrl.quant.lean`) (whether ONNX Runtime's u8·s8 product is exact here) and by the
benchmarks (every figure names its machine). Imports nothing heavy: a robot's loader uses it.
"""

from typing import Optional


def cpu_info() -> tuple[str, Optional[set]]:
    """`(model name, flags)` of the first CPU in /proc/cpuinfo; `("", None)` where it cannot be
    read (not Linux, or no access)."""
    model, flags = "", None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return model, flags


def isa_class(flags: Optional[set]) -> str:
    """The matrix units that set int8 / bf16 speed: "AMX", "AVX-512 VNNI+BF16", "AVX-512 VNNI",
    "AVX-512", "AVX-VNNI", "AVX2", "other x86" or "unknown" (flags unreadable)."""
    if flags is None:
        return "unknown"
    if "amx_int8" in flags:
        return "AMX"
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI+BF16" if "avx512_bf16" in flags else "AVX-512 VNNI"
    if "avx512f" in flags:
        return "AVX-512"
    if "avx_vnni" in flags:
        return "AVX-VNNI"
    if "avx2" in flags:
        return "AVX2"
    return "other x86" if "sse2" in flags else "unknown"
