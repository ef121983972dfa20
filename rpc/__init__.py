"""Privileged helpers of nvc-py and the framed protocol they speak over a socketpair.

Installed as ``nvc.rpc``: the parent plans, the forked helpers act with the least privilege.

Modules: ``protocol`` (length-prefixed JSON frames, versioned schema), ``helper`` (fork a
named helper, serve a dispatch table in it, call it with a deadline, reap it) and ``driver_service`` (the
``nvc:[driver]`` helper: NVML loaded from the driver root; ``open_driver(...).snapshot()``). What
each helper keeps of root's power is a row of :mod:`nvc.system.confinement`. ``driver_wire`` is the
driver helper's parameters and result, which ``native_snapshot`` shares: the answer of the native driver
helper (native/driver), which answers every snapshot no warm Python helper does.
"""

DEFAULT_TIMEOUT = 10.0  # seconds per helper call, as the reference client's hard-coded limit
