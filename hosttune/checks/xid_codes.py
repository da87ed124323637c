"""NVIDIA Xid codes: which ones take a GPU out of service, and what each means."""

from __future__ import annotations

from enum import Enum

# A GPU that logged one of these needs a reset or a reboot (some an RMA) before it serves again.
FATAL = frozenset({48, 56, 57, 58, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 119, 120})

MEANING = {
    13: "graphics engine exception (usually an application bug)",
    31: "GPU memory page fault (usually an application bug)",
    32: "invalid or corrupted push buffer stream",
    38: "driver firmware error",
    43: "GPU stopped processing (an application fault)",
    45: "preemptive cleanup after an earlier error",
    48: "double-bit ECC error: uncorrectable memory error",
    56: "display engine error",
    57: "error programming video memory interface",
    58: "unstable video memory interface detected",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    65: "video processor exception",
    68: "video processor (NVDEC) exception",
    69: "graphics engine class error",
    73: "NVENC error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    80: "corrupted data sent to the GPU",
    81: "VGA subsystem error",
    92: "high single-bit ECC error rate",
    94: "contained ECC error (the application using the memory was stopped)",
    95: "uncontained ECC error (every application on the GPU was stopped)",
    109: "context switch timeout",
    119: "GSP RPC timeout: the GPU firmware stopped answering",
    120: "GSP error: the GPU firmware reported a fault",
    121: "C2C link error",
    140: "unrecovered ECC error",
    154: "GPU recovery action changed (the driver asks for a reset or reboot)",
}


def meaning(code: int) -> str:
    return MEANING.get(code, "see NVIDIA's Xid catalogue")


class Recovery(str, Enum):
    """NVIDIA's documented recovery action for an Xid (the catalogue's "resolution" column)."""

    IGNORE = "ignore"  # informational: nothing to do
    RESTART_APP = "restart-app"  # an application fault: the GPU is fine
    RESET_GPU = "reset-gpu"  # drain the GPU, reset it
    REBOOT = "reboot"  # reset does not recover it: reboot the node

    def __str__(self) -> str:
        return self.value


_RECOVERY = {
    **dict.fromkeys((13, 31, 43, 94, 109), Recovery.RESTART_APP),
    45: Recovery.IGNORE,  # the driver cleaning up after an earlier error, which carries its own code
    **dict.fromkeys((32, 38, 48, 56, 57, 58, 61, 62, 63, 64, 65, 68, 69, 73, 74, 79, 80, 81, 92, 95, 119, 120, 140, 154),
                    Recovery.RESET_GPU),
    121: Recovery.REBOOT,  # the C2C link retrains only at boot
}


def recovery(code: int) -> Recovery:
    """What NVIDIA documents as the recovery from this Xid; an unknown code is only logged."""
    return _RECOVERY.get(code, Recovery.IGNORE)
