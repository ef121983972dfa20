"""The process and the kernel: system calls Python lacks, what each process keeps of root's power,
reading what others wrote, the standard streams, the environment a root program refuses, the
caches under /run/nvc-py, and where nvc-py's own programs are installed."""
