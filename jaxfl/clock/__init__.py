"""The simulated clock: clients' availability and devices, and how long a synchronous round takes."""

from jaxfl.clock.availability import Availability, diurnal_availability, next_online, online, online_until
from jaxfl.clock.profiles import DeviceProfiles, client_durations, lognormal_profiles
from jaxfl.clock.reporting import Clock, reports, select_online
from jaxfl.clock.traces import read_availability, read_profiles

__all__ = [
    "Availability", "Clock", "DeviceProfiles", "client_durations", "diurnal_availability",
    "lognormal_profiles",
    "next_online", "online", "online_until", "read_availability", "read_profiles", "reports", "select_online",
]  # fmt: skip
