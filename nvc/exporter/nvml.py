"""Each GPU's memory from NVML, through one driver helper (:mod:`nvc.rpc.driver_service`) kept for the
exporter's life: NVML loads once, a read is one call to the helper. A scrape asks at most once, and
a read younger than the interval is answered again without asking (several Prometheus servers
scraping one node cost NVML no more). A helper that fails is closed; the next read due starts another.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

from nvc.config.options import GlobalOptions
from nvc.errors import NvcError
from nvc.records import NamedTuple


class GpuMemory(NamedTuple):
    index: int
    uuid: str
    model: str
    total: int  # bytes
    used: int


class Reading(NamedTuple):
    gpus: tuple[GpuMemory, ...]
    ok: bool  # False: NVML could not be asked (then no GPUs)


class GpuMemoryCache:
    def __init__(self, opts: GlobalOptions, interval: float) -> None:
        self.opts, self.interval = opts, interval
        self.stack = ExitStack()
        self.driver: Any = None  # DriverClient while the helper answers
        self.at: float | None = None  # monotonic time of the last read
        self.last = Reading((), False)

    def read(self) -> Reading:
        now = time.monotonic()
        if self.at is not None and now - self.at < self.interval:
            return self.last
        self.at = now
        try:
            if self.driver is None:
                from nvc.rpc import driver_service

                self.driver = self.stack.enter_context(driver_service.open_driver(self.opts.root, self.opts.user))
            self.last = Reading(tuple(GpuMemory(**gpu) for gpu in self.driver.memory()), True)
        except (NvcError, TypeError):  # TypeError: an answer of another shape (a helper of other code)
            self.close()
            self.last = Reading((), False)
        return self.last

    def close(self) -> None:
        self.stack.close()
        self.driver = None
