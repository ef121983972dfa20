"""The few ELF facts library selection checks.

The ld cache says which architecture a library was registered for; the file itself
must agree (a stale cache or a mixed multilib tree can point a 64-bit name at a 32-bit
file). Two driver libraries need more: NVIDIA ships two builds of ``libnvidia-tls``
told apart by their GNU ABI note, and the non-GLVND ``libGL``/``libEGL`` are only the
driver's own when they link against ``libnvidia-glcore``/``libnvidia-eglcore``.
pyelftools is imported lazily: most commands never open an ELF file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

# ld cache architecture → (ELF class, e_machine) of the files it may point at.
ARCH_ELF: dict[str, tuple[int, str]] = {
    "x86_64": (64, "EM_X86_64"),
    "i386": (32, "EM_386"),
    "x32": (32, "EM_X86_64"),
    "aarch64": (64, "EM_AARCH64"),
    "armhf": (32, "EM_ARM"),
    "ppc64le": (64, "EM_PPC64"),
}


@dataclass(frozen=True)
class ElfFacts:
    """What selection needs to know about one shared object."""

    elf_class: int  # 32 or 64
    machine: str  # pyelftools' e_machine name, e.g. "EM_X86_64"
    needed: tuple[str, ...]  # DT_NEEDED entries
    abi_tag: tuple[int, int, int] | None  # GNU/Linux ABI note version, e.g. (2, 3, 99)

    def matches(self, arch: str) -> bool:
        """Whether the file is built for the ld cache architecture ``arch``."""
        return (self.elf_class, self.machine) == ARCH_ELF[arch]

    def needs_any(self, prefixes: tuple[str, ...]) -> bool:
        """Whether some DT_NEEDED entry starts with one of ``prefixes``."""
        return any(n.startswith(prefixes) for n in self.needed)


def read_facts(path: str) -> ElfFacts | None:
    """Facts of the ELF file at ``path`` (a host path), or None if it is not a readable ELF file."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as stream:
            elf = ELFFile(stream)
            needed: list[str] = []
            abi_tag = None
            for segment in elf.iter_segments():
                if segment["p_type"] == "PT_DYNAMIC":
                    needed.extend(t.needed for t in segment.iter_tags() if t.entry.d_tag == "DT_NEEDED")
                elif segment["p_type"] == "PT_NOTE":
                    for note in segment.iter_notes():
                        desc = note["n_desc"]
                        if note["n_type"] == "NT_GNU_ABI_TAG" and desc["abi_os"] == "ELF_NOTE_OS_LINUX":
                            abi_tag = (desc["abi_major"], desc["abi_minor"], desc["abi_tiny"])
            return ElfFacts(elf.elfclass, elf["e_machine"], tuple(needed), abi_tag)
    except (OSError, ELFError, ValueError) as err:
        log.debug("%s: not a usable ELF file: %s", path, err)
        return None
