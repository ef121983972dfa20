"""Planning, pure: which GPUs a request selects, whether the driver meets its requirements,
and the mount plan with the device nodes and cgroup rules a container gets.

Nothing here changes the system, so every rule is testable without root and ``configure
--dry-run`` prints exactly what would be done. May import nvc's basics and discovery's
records and parsers, nothing above.
"""
