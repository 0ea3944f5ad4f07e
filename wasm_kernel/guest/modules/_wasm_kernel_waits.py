"""input(), getpass() and time.sleep() for the sandbox: each waits on the kernel (for the
person, or for the time), which can end the wait with an interrupt.

``_wasm_kernel.boot`` puts them in place; ``_wasm_kernel`` takes this module afresh when it is
installed and checks it as its own (``_intact``).
"""

import sys

import _wasm_kernel_contract as contract


class StdinNotImplementedError(NotImplementedError):
    """Raised by input() when the Jupyter client does not accept input requests."""


StdinNotImplementedError.__module__ = "builtins"  # shown by its bare name, as in ipykernel


def _kernel():
    """The kernel's guest module as it is now (the host may have reinstalled it)."""
    return sys.modules["_wasm_kernel"]


def _read_line(prompt, password):
    try:
        reply = _kernel().call_host(contract.INPUT, prompt=str(prompt), password=password)
    except KeyboardInterrupt as exc:  # the interrupt's signal flags, as the wait ended
        if type(exc) is not KeyboardInterrupt:  # TimeLimitExceeded says why itself
            raise
        reply = {"error": contract.INTERRUPTED}
    failure = reply.get("error")
    if failure == contract.NO_STDIN:
        raise StdinNotImplementedError(  # ipykernel's words
            "raw_input was called, but this frontend does not support input requests."
        )
    if failure == contract.EOF:
        raise EOFError("EOF when reading a line")
    if failure == contract.INTERRUPTED:
        raise KeyboardInterrupt("Interrupted by user")
    return reply.get("value", "")


def input(prompt=""):
    return _read_line(prompt, password=False)


def getpass_(prompt="Password: ", stream=None):
    return _read_line(prompt, password=True)


def sleep(seconds):
    """time.sleep that the kernel can cut short with an interrupt."""
    seconds = float(seconds)
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    kernel = _kernel()
    if kernel.call_host(contract.SLEEP, seconds=seconds).get("interrupted"):
        raise kernel.interruption()
