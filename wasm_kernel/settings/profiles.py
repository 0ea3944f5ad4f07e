"""Named sets of defaults for the kernel's limits and mounts.

A profile only supplies defaults: anything set in the config file, on the command line or
in a ``WASM_KERNEL_*`` variable wins over it. ``python -m wasm_kernel install`` registers one
kernelspec per profile (``--sandbox-profile NAME`` picks).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    mounts: tuple[str, ...]
    fuel: int
    time_limit: float
    memory_limit: int
    output_limit: int
    scratch_limit: int
    active_output: str  # "block" or "allow": see WasmKernel.active_output
    notebook_writes: str  # "overlay", "new-files" or "refuse": see WasmKernel.notebook_writes
    packages: str  # "index", "off" or a wheelhouse folder: see WasmKernel.packages
    packages_quota: int  # bytes of packages one kernel may install
    keeps_history: bool  # input history in the per-user file (else in memory only)
    hibernate: bool  # save the session's image at shutdown, resume it at the next start
    snapshots: bool  # cells may save and restore images with %snapshot
    kernel_suffix: str  # appended to the kernelspec name and display name


PROFILES = {
    profile.name: profile
    for profile in (
        Profile(
            name="notebook",
            summary="the notebook's folder is readable at /notebook, where cells start"
            " (unless it is the home folder); writes there, and in the private scratch folder"
            " /tmp, stay in the session;"
            " %pip installs pure-Python wheels from the index the host's pip uses",
            mounts=(".:/notebook:ro",),
            fuel=5_000_000_000_000,
            time_limit=600.0,
            memory_limit=2 << 30,
            output_limit=10 << 20,
            scratch_limit=1 << 30,
            active_output="block",
            notebook_writes="overlay",
            packages="index",
            packages_quota=1 << 30,
            keeps_history=True,
            hibernate=True,
            snapshots=True,
            kernel_suffix="",
        ),
        Profile(
            name="strict",
            summary="no host folder, only the private scratch folder /tmp, and small fuel,"
            " time, memory and output budgets, no %pip install",
            mounts=(),
            # well past what 60 s of work burns (1-2e10 units a second), so an endless loop
            # meets the time limit, the budget people understand; fuel bounds the CPU
            # whatever the machine's load
            fuel=2_000_000_000_000,
            time_limit=60.0,
            memory_limit=512 << 20,
            output_limit=1 << 20,
            scratch_limit=64 << 20,
            active_output="block",
            notebook_writes="refuse",
            packages="off",  # an operator may grant a wheelhouse folder
            packages_quota=256 << 20,
            keeps_history=False,  # graded cells and hidden tests stay off the operator's disk
            hibernate=False,
            snapshots=False,
            kernel_suffix="strict",
        ),
    )
}
DEFAULT_PROFILE = "notebook"
