"""Energy and carbon of a run: measured through Intel RAPL (codecarbon) where readable, else modelled.

The ActorQ paper reports 1.9–3.76× less carbon with int8 actors. We estimate a run's energy
in one of two ways, and every result says which (`"method"`) and how (`"note"`):

- `cpu_power_model`: energy = CPU-seconds × a per-core power. This is a model, not a
  measurement: it charges every busy core-second at the core's share of the package TDP
  (an upper-end figure: TDP is sustained full-load power) and leaves out idle power, DRAM,
  accelerators and data-centre overhead (PUE). Default 6.25 W per core = 350 W TDP / 56
  cores of an Intel Xeon Platinum 8480+ (Sapphire Rapids, the AMX int8/bf16 server part of
  the machines these runs target; Intel ARK product specifications).
- `codecarbon_rapl`: codecarbon's `OfflineEmissionsTracker` reading the CPU package energy
  counters (Intel RAPL, `/sys/class/powercap/intel-rapl*/energy_uj`). It measures the whole
  machine's CPU packages over the run (other processes included), so the model is reported
  beside it for comparison.

Carbon = kWh × grid intensity; default 0.475 kg CO2 per kWh, the world-average carbon
intensity of electricity generation (IEA, Global Energy & CO2 Status Report 2019, for 2018).
"""

import glob
import logging
import shutil
import tempfile
import time
from typing import Any, Optional

from qrl.errors import QrlInputError

DEFAULT_WATTS_PER_CORE = 350.0 / 56  # Intel Xeon Platinum 8480+: 350 W TDP, 56 cores.
DEFAULT_CARBON_INTENSITY = 0.475  # kg CO2 / kWh, IEA world average (2018).
RAPL_ENERGY_GLOB = "/sys/class/powercap/intel-rapl*/energy_uj"
JOULES_PER_KWH = 3.6e6

MODEL_NOTE = (
    "modelled, not measured: CPU-seconds x {watts:.3g} W per core ({source}); "
    "carbon at {intensity:.3g} kg CO2/kWh ({intensity_source}); excludes idle power, DRAM and PUE"
)
DEFAULT_WATTS_SOURCE = "Intel Xeon Platinum 8480+ TDP 350 W / 56 cores"
DEFAULT_INTENSITY_SOURCE = "IEA world average"


def cpu_power_model(
    cpu_seconds: float,
    watts_per_core: float = DEFAULT_WATTS_PER_CORE,
    carbon_intensity: float = DEFAULT_CARBON_INTENSITY,
) -> dict:
    """Energy and carbon of `cpu_seconds` busy core-seconds at `watts_per_core` each.

    Returns {"method": "cpu_power_model", "cpu_seconds", "kwh", "kg_co2", "watts_per_core",
    "carbon_intensity_kg_per_kwh", "note"}; e.g. 3600 CPU-s at 10 W = 0.01 kWh.
    """
    for name, value in (("cpu_seconds", cpu_seconds), ("watts_per_core", watts_per_core),
                        ("carbon_intensity", carbon_intensity)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
            raise QrlInputError(f"{name} must be a non-negative number, got {value!r}")
    kwh = float(cpu_seconds) * float(watts_per_core) / JOULES_PER_KWH
    watts_source = DEFAULT_WATTS_SOURCE if watts_per_core == DEFAULT_WATTS_PER_CORE else "given"
    intensity_source = DEFAULT_INTENSITY_SOURCE if carbon_intensity == DEFAULT_CARBON_INTENSITY else "given"
    return {
        "method": "cpu_power_model",
        "cpu_seconds": float(cpu_seconds),
        "kwh": kwh,
        "kg_co2": kwh * float(carbon_intensity),
        "watts_per_core": float(watts_per_core),
        "carbon_intensity_kg_per_kwh": float(carbon_intensity),
        "note": MODEL_NOTE.format(watts=watts_per_core, source=watts_source, intensity=carbon_intensity,
                                  intensity_source=intensity_source),
    }


def rapl_readable(pattern: str = RAPL_ENERGY_GLOB) -> bool:
    """Whether some RAPL package energy counter exists and this process may read it."""
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="ascii") as counter:
                int(counter.read().strip())
            return True
        except (OSError, ValueError):
            continue
    return False


def _make_tracker(output_dir: str, carbon_intensity: float) -> Any:
    """A quiet offline codecarbon tracker that writes no files (imported here: it is optional)."""
    logging.getLogger("codecarbon").setLevel(logging.ERROR)
    from codecarbon import OfflineEmissionsTracker

    return OfflineEmissionsTracker(
        country_iso_code="USA",  # required offline; the intensity below overrides its grid data.
        force_carbon_intensity_g_co2e_kwh=carbon_intensity * 1000.0,
        save_to_file=False, output_dir=output_dir, log_level="error", tracking_mode="machine",
        measure_power_secs=60, allow_multiple_runs=True,
    )


def _tracker_uses_rapl(tracker: Any) -> bool:
    return any(getattr(hardware, "_mode", None) == "intel_rapl" for hardware in getattr(tracker, "_hardware", ()))


class EnergyMeter:
    """Energy of one run: `start()` before, `stop(cpu_seconds)` after -> the energy dict.

    Measures with codecarbon only where RAPL is readable and codecarbon actually uses it;
    otherwise (or if codecarbon fails in any way) returns `cpu_power_model`, with the reason in
    "note". Never raises because of codecarbon.
    """

    def __init__(self, watts_per_core: float = DEFAULT_WATTS_PER_CORE,
                 carbon_intensity: float = DEFAULT_CARBON_INTENSITY) -> None:
        self.watts_per_core = watts_per_core
        self.carbon_intensity = carbon_intensity
        self._tracker: Optional[Any] = None
        self._temp_dir: Optional[str] = None
        self._fallback_reason = "not started"
        self._start_time: Optional[float] = None

    def start(self) -> None:
        self._start_time = time.perf_counter()
        if not rapl_readable():
            self._fallback_reason = "Intel RAPL energy counters are not readable here"
            return
        try:
            self._temp_dir = tempfile.mkdtemp(prefix="qrl_codecarbon_")
            tracker = _make_tracker(self._temp_dir, self.carbon_intensity)
            tracker.start()
            if not _tracker_uses_rapl(tracker):
                tracker.stop()
                self._fallback_reason = "codecarbon did not select its RAPL power source"
                self._cleanup()
                return
            self._tracker = tracker
        except Exception as error:  # codecarbon is optional: any failure means the model.
            self._fallback_reason = f"codecarbon failed to start ({type(error).__name__}: {error})"
            self._cleanup()

    def stop(self, cpu_seconds: float) -> dict:
        """The run's energy dict (see `cpu_power_model`); with RAPL also "model" and
        "wall_seconds", and "kwh" is the CPU package energy codecarbon measured."""
        model = cpu_power_model(cpu_seconds, self.watts_per_core, self.carbon_intensity)
        tracker, self._tracker = self._tracker, None
        if tracker is None:
            return {**model, "note": f"{model['note']}; {self._fallback_reason}"}
        try:
            tracker.stop()
            data = tracker.final_emissions_data
            kwh = float(data.cpu_energy)
            total_kwh = float(data.energy_consumed)
        except Exception as error:
            return {**model, "note": f"{model['note']}; codecarbon failed to stop ({type(error).__name__}: {error})"}
        finally:
            self._cleanup()
        wall = time.perf_counter() - self._start_time if self._start_time is not None else None
        return {
            "method": "codecarbon_rapl", "cpu_seconds": model["cpu_seconds"], "kwh": kwh,
            "kg_co2": kwh * self.carbon_intensity, "watts_per_core": model["watts_per_core"],
            "carbon_intensity_kg_per_kwh": model["carbon_intensity_kg_per_kwh"],
            "codecarbon_total_kwh": total_kwh, "wall_seconds": wall, "model": model,
            "note": ("measured: CPU package energy from Intel RAPL via codecarbon over the whole machine "
                     "(other processes included; codecarbon_total_kwh adds its RAM estimate); "
                     f"carbon at {self.carbon_intensity:.3g} kg CO2/kWh; 'model' is the CPU-seconds model"),
        }

    def _cleanup(self) -> None:
        if self._temp_dir is not None:
            shutil.rmtree(self._temp_dir, ignore_errors=True)
            self._temp_dir = None
