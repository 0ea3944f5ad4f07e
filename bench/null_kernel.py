"""An ipykernel kernel that runs nothing: every execute_request gets an empty "ok" reply.

Its start time is the floor for any kernel built on ipykernel's application, wasm-kernel
included (bench/run.py, section start): the native kernel's start minus IPython's shell.
"""

from __future__ import annotations

from typing import Any

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel


class NullKernel(Kernel):
    implementation = "null"
    implementation_version = "0"
    banner = "runs nothing"
    language_info = {"name": "python", "mimetype": "text/x-python", "file_extension": ".py"}

    async def do_execute(  # type: ignore[override]
        self, code: str, silent: bool, *args: Any, **kwargs: Any
    ) -> dict:
        return {"status": "ok", "execution_count": self.execution_count, "payload": []}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=NullKernel)
