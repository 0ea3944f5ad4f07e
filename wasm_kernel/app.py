"""The kernel application: ipykernel's launcher with our kernel class and config file."""

from __future__ import annotations

from ipykernel.kernelapp import IPKernelApp
from jupyter_core.paths import jupyter_config_path
from traitlets import Type
from traitlets.config import Application

from .kernel import WasmKernel

CONFIG_FILE = "jupyter_wasm_kernel_config"


class WasmKernelApp(IPKernelApp):
    name = "wasm-kernel"
    description = "A Jupyter kernel running Python in a WebAssembly sandbox."
    classes = [*IPKernelApp.classes, WasmKernel]
    kernel_class = Type(WasmKernel, klass="ipykernel.kernelbase.Kernel").tag(config=True)

    def start(self) -> None:
        """Run the kernel; once its loop ends, let the control thread finish first.

        After a shutdown_request the control thread still flushes stdout through the iopub
        thread. At exit ipykernel stops the iopub thread before joining the control thread,
        so a late flush would wait out its 10 s timeout (or block): join it while iopub runs.
        """
        super().start()
        if self.control_thread and self.control_thread.is_alive():
            self.control_thread.stop()
            self.control_thread.join()

    def init_sockets(self) -> None:
        """Bind the kernel's ports; warn about unencrypted TCP only where it matters.

        ipykernel warns at every start that TCP without CurveZMQ can be eavesdropped, and
        Jupyter shows that in its log for every kernel. On a loopback address only accounts on
        this machine can reach the ports: there it goes to the info level, saying how to turn
        encryption on. Any other address keeps ipykernel's warning.
        """
        import ipaddress

        try:
            loopback = ipaddress.ip_address(self.ip).is_loopback
        except ValueError:
            loopback = self.ip == "localhost"
        if self.transport != "tcp" or self.curve_secretkey is not None or not loopback:
            super().init_sockets()
            return

        def quiet(record: object) -> bool:
            return not str(getattr(record, "msg", "")).startswith(
                "Kernel is running over TCP without encryption")

        self.log.addFilter(quiet)
        try:
            super().init_sockets()
        finally:
            self.log.removeFilter(quiet)
        self.log.info(
            "Kernel ports on %s are not encrypted: other accounts on this machine could read"
            " its messages. To encrypt them, start Jupyter with"
            " --KernelManager.transport_encryption=auto (this kernelspec supports CurveZMQ).",
            self.ip,
        )

    def init_profile_dir(self) -> None:
        """No IPython profile: settings live in the Jupyter config file, and IPython would
        write a profile folder to HOME (a fresh temporary one at every start if HOME is
        read-only)."""
        self.profile_dir = None

    def load_config_file(self, suppress_errors: object = None) -> None:
        """Read ``jupyter_wasm_kernel_config.py`` from the Jupyter config path only, never from
        the working folder: a config file is Python that runs on the host."""
        Application.load_config_file(self, CONFIG_FILE, path=jupyter_config_path())
