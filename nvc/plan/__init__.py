"""Planning, pure: the request (:mod:`.request`, one record whether the CLI's flags or an OCI
spec made it), which GPUs it selects, whether the driver meets its requirements, and the mount
plan with the device nodes, cgroup rules and host steps (driver nodes, sharing files) a container gets.

Nothing here changes the system, so every rule is testable without root and ``configure
--dry-run`` prints exactly what would be done. May import nvc's basics and discovery's
records and parsers, nothing above.
"""
