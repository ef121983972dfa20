"""Discovery: what the host has. The driver's version and GPUs (/proc, or NVML through
:mod:`nvc.rpc.driver_service`), its files (ld cache, ELF, the driver root), device nodes and
their majors, and the kernel modules' nodes (``load-kmods``).

Reads the host, and the container's image through its root (:mod:`.container`); changes
nothing. May import nvc's basics (errors, logging, records such as :mod:`nvc.model.devices`),
nothing above.
"""
