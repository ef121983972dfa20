"""GPU sharing: a container's limits and weight from its env (:mod:`.limits`), the per-container
files the sharing shim (native/) reads, and the readers of what the shim writes (:mod:`.region`,
:mod:`.sched`) behind ``nvc-py share status`` (:mod:`.status`).

May import nvc's basics, planning (the mounts a shared container gets) and applying (its tmpfs),
nothing above.
"""
