"""The pipeline: one container start's steps, in the order libnvidia-container runs its own
(init, container, driver and device mounts, ldcache update), each a named function over plain
records. :mod:`.configure`: check the request (once), resolve the container (once: its
process's handle and what its image has), discover what the host has, plan (pure); then
:mod:`.apply`: apply the plan (host nodes and sharing files, the container helper's mounts, the
device cgroup) and update the ld cache, undone together on failure.

Its callers: the CLI's ``configure``, the OCI hook's prestart and the hook server's workers (the
whole sequence or its dry plan), the runtime wrapper (the device nodes a request gets). The layer
between :mod:`nvc.rpc`, whose helpers only carry its calls, and the commands.
"""
