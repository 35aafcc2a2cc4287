"""What this CPU is: its model name and ISA flags as Linux's /proc/cpuinfo names them.

Read by the int8 ONNX path (whether ONNX Runtime's u8·s8 product is exact here) and by the
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
