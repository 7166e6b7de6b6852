"""Clocks and throttle state through NVML (nvidia-ml-py), read before and after each measurement."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Clock-event reasons that mean the GPU ran slower than it could (idle and the user's application-clock
# setting are not throttling).
_SLOWDOWN_REASONS = {
    "nvmlClocksEventReasonSwPowerCap": "sw-power-cap",
    "nvmlClocksEventReasonHwSlowdown": "hw-slowdown",
    "nvmlClocksEventReasonSwThermalSlowdown": "sw-thermal",
    "nvmlClocksEventReasonHwThermalSlowdown": "hw-thermal",
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": "hw-power-brake",
    "nvmlClocksEventReasonSyncBoost": "sync-boost",
}


@dataclass(frozen=True)
class ClockState:
    sm_clock_mhz: int | None
    mem_clock_mhz: int | None
    temperature_c: int | None
    power_limit_w: float | None
    throttle_reasons: tuple[str, ...]

    @property
    def throttled(self) -> bool:
        return bool(self.throttle_reasons)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Nvml:
    """One GPU's NVML handle; every read degrades to None where NVML or a field is unavailable.

    Prefer ``uuid``: NVML numbers GPUs as the host does and ignores CUDA_VISIBLE_DEVICES, so torch's device
    index can name another GPU. Without a UUID, ``index`` is NVML's index."""

    def __init__(self, index: int = 0, uuid: str | None = None):
        self._nvml = None
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = (pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid
                            else pynvml.nvmlDeviceGetHandleByIndex(index))
            self._nvml = pynvml
        except Exception:  # no driver, no library, no such device: clocks go unrecorded, never another GPU's
            self._nvml = None

    def _read(self, fn_name: str, *args: Any) -> Any:
        if self._nvml is None:
            return None
        try:
            return getattr(self._nvml, fn_name)(self._handle, *args)
        except Exception:
            return None

    def state(self) -> ClockState:
        nvml = self._nvml
        if nvml is None:
            return ClockState(None, None, None, None, ())
        reasons_mask = self._read("nvmlDeviceGetCurrentClocksEventReasons")
        if reasons_mask is None:
            reasons_mask = self._read("nvmlDeviceGetCurrentClocksThrottleReasons")
        reasons = tuple(
            label for attr, label in _SLOWDOWN_REASONS.items()
            if reasons_mask and getattr(nvml, attr, 0) & reasons_mask
        )
        power = self._read("nvmlDeviceGetEnforcedPowerLimit")
        return ClockState(
            sm_clock_mhz=self._read("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_SM),
            mem_clock_mhz=self._read("nvmlDeviceGetClockInfo", nvml.NVML_CLOCK_MEM),
            temperature_c=self._read("nvmlDeviceGetTemperature", nvml.NVML_TEMPERATURE_GPU),
            power_limit_w=power / 1000 if power is not None else None,
            throttle_reasons=reasons,
        )
