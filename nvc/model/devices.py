"""What nvc-py knows about one GPU and its MIG devices.

Immutable records (named tuples: created at import far more cheaply than dataclasses, which
the hook pays for at every container start) shared by discovery (NVML helper or /proc fast path),
device selection, planning and the CLI's output.
"""

from nvc.records import NamedTuple


class MigDevice(NamedTuple):
    """One MIG device (a GPU instance + compute instance pair) of a MIG-enabled GPU."""

    index: int  # position in NVML's MIG handle enumeration (the M of "G:M")
    gpu_instance_id: int
    compute_instance_id: int
    uuid: str  # "MIG-…"
    memory_total: int | None = None  # bytes
    # Filled from /proc (not NVML): the access files and their nvidia-caps minors.
    gi_caps_path: str | None = None  # /proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access
    ci_caps_path: str | None = None  # …/gi<G>/ci<C>/access
    gi_caps_minor: int | None = None
    ci_caps_minor: int | None = None
    name: str | None = None  # NVML's name, "<GPU model> MIG <profile>" ("… MIG 2g.10gb")


class Gpu(NamedTuple):
    """One physical GPU as the driver reports it."""

    index: int  # NVML index
    minor: int  # /dev/nvidia<minor>
    model: str  # "NVIDIA H100 80GB HBM3"
    brand: str  # reference brand name: "Nvidia", "Tesla", "GeForce", …
    uuid: str  # "GPU-…"
    bus_id: str  # normalised "%08x:%02x:%02x.0", upper-case hex as NVML prints it
    architecture: str  # CUDA compute capability "major.minor"
    memory_total: int | None = None  # bytes; None when read from /proc only
    mig_enabled: bool = False
    mig_devices: tuple[MigDevice, ...] = ()


class DriverSnapshot(NamedTuple):
    """What NVML reported, in one piece: versions and every GPU with its MIG devices."""

    driver_version: str  # "580.95.05"
    cuda_version: int  # nvmlSystemGetCudaDriverVersion: 13000 means CUDA 13.0
    gpus: tuple[Gpu, ...]
