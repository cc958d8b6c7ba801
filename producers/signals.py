"""Device and parcel models: plausible, smoothly varying readings, deterministic from the seed (pure)."""

from __future__ import annotations

import math
import random

MEASUREMENTS = (
    "air_temperature_c",
    "air_humidity_pct",
    "soil_nitrogen_mg_kg",
    "soil_salinity_ds_m",
    "battery_v",
)
BASE_FIELDS = ("schema_version", "event_id", "device_id", "parcel_id", "seq", "event_time", *MEASUREMENTS)
# The ranges the streaming job accepts; generated values stay well inside them.
VALID_RANGES: dict[str, tuple[float, float]] = {
    "air_temperature_c": (-60.0, 70.0),
    "air_humidity_pct": (0.0, 100.0),
    "soil_nitrogen_mg_kg": (0.0, 2000.0),
    "soil_salinity_ds_m": (0.0, 60.0),
    "battery_v": (0.0, 5.0),
}

_MINUTE_MS = 60_000
_HOUR_MS = 3_600_000
_TEN_MINUTES_MS = 600_000
# Daily temperature wave per minute of the UTC day: -1 at 03:00, +1 at 15:00.
_DAILY = tuple(math.sin(2 * math.pi * (m / 60 - 9) / 24) for m in range(1440))
_BATTERY_EMPTY, _BATTERY_SPAN = 3.3, 0.9  # volts: empty, and full minus empty


def device_ids(devices: int) -> list[str]:
    """Device ids dev-00001 ... (zero-padded to at least 5 digits)."""
    width = max(5, len(str(devices)))
    return [f"dev-{i:0{width}d}" for i in range(1, devices + 1)]


def parcel_ids(parcels: int) -> list[str]:
    """Parcel ids parcel-001 ... (zero-padded to at least 3 digits)."""
    width = max(3, len(str(parcels)))
    return [f"parcel-{i:0{width}d}" for i in range(1, parcels + 1)]


class Fleet:
    """N devices on M parcels (device i on parcel i mod M) with per-device signal state."""

    def __init__(self, devices: int, parcels: int, seed: int, start_time_ms: int) -> None:
        layout = random.Random(f"sensor-sim:{seed}:fleet")
        self.device_ids = device_ids(devices)
        self.parcel_ids = parcel_ids(parcels)
        self.parcel_of = [i % parcels for i in range(devices)]
        parcel_temp = [layout.uniform(-3.0, 3.0) for _ in range(parcels)]
        parcel_humidity = [layout.uniform(-8.0, 8.0) for _ in range(parcels)]
        parcel_nitrogen = [layout.uniform(20.0, 80.0) for _ in range(parcels)]
        parcel_salinity = [layout.uniform(0.5, 4.0) for _ in range(parcels)]
        p = self.parcel_of
        self._constants: list[tuple[float, float, float, float, float, float, int]] = []
        for d in range(devices):
            drain = layout.uniform(0.002, 0.01) / _HOUR_MS  # volts per ms
            self._constants.append(
                (
                    15.0 + parcel_temp[p[d]] + layout.uniform(-0.5, 0.5),  # temperature offset
                    60.0 + parcel_humidity[p[d]],  # humidity at 15 degrees C
                    parcel_nitrogen[p[d]] * layout.uniform(0.9, 1.1),  # mean nitrogen
                    parcel_salinity[p[d]] * layout.uniform(0.9, 1.1),  # salinity
                    # Battery as a sawtooth over simulated time: drains, swapped for a full one when empty.
                    layout.uniform(0.0, _BATTERY_SPAN) + drain * start_time_ms,  # charge extrapolated to t=0
                    drain,
                    layout.randrange(1440),  # phase of the slow nitrogen wave
                )
            )
        self._temp_drift = [0.0] * devices
        self._noise = random.Random(f"sensor-sim:{seed}:noise").random

    def sample(self, dev: int, t_ms: int) -> tuple[float, float, float, float, float]:
        """The five readings of device `dev` at `t_ms`, advancing its temperature drift by one step.

        Bounds by construction: temperature 15 +- 13.7, humidity 60 +- 8 - 2 * (temperature - 15) +- 1
        (so 23.6..96.4), nitrogen 18..92 * (1 +- 0.15) +- 0.25, salinity 0.45..4.4 +- 0.025,
        battery 3.3..4.2: always inside VALID_RANGES.
        """
        r = self._noise
        temp_offset, humidity_offset, nitrogen_mean, salinity, charge_at_zero, drain, phase = self._constants[dev]
        drift = self._temp_drift[dev] + (r() - 0.5) * 0.1
        drift = 2.0 if drift > 2.0 else -2.0 if drift < -2.0 else drift
        self._temp_drift[dev] = drift
        temp = temp_offset + 8.0 * _DAILY[(t_ms // _MINUTE_MS) % 1440] + drift + (r() - 0.5) * 0.4
        humidity = humidity_offset - 2.0 * (temp - 15.0) + (r() - 0.5) * 2.0
        # Nitrogen drifts along a 10-day wave (one table step per 10 minutes).
        wave = _DAILY[(t_ms // _TEN_MINUTES_MS + phase) % 1440]
        nitrogen = nitrogen_mean * (1.0 + 0.15 * wave) + r() * 0.5 - 0.25
        salinity += (r() - 0.5) * 0.05
        battery = _BATTERY_EMPTY + (charge_at_zero - drain * t_ms) % _BATTERY_SPAN
        return temp, humidity, nitrogen, salinity, battery
