"""``nvc-py exporter``: Prometheus metrics of GPU sharing, the hook and the device plugin.

Each scrape reads afresh what the other parts of nvc-py leave on the host: the sharing directories
(:mod:`nvc.commands.sharestatus`), the hook's log (:mod:`.hooklog`, read on from where the last scrape
stopped), the hook server's socket (:mod:`.unixdiag`), the device plugin's health file
(:mod:`nvc.k8s.published`) and, not more often than an interval, NVML through a driver helper
(:mod:`.nvml`). :mod:`.collector` turns one reading into metric families (prometheus_client's
custom collector API), :mod:`.serve` answers HTTP on a TCP address or a unix socket.

Only :mod:`.command` is imported by the CLI at start-up; prometheus_client loads when the exporter
runs. docs/metrics.md lists every metric.
"""
