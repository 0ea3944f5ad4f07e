"""capture_output and CapturedIO: what ``%%capture`` and ``with capture_output()`` give."""

import io
import sys

import _wasm_kernel


class RichOutput:
    """One captured display (or clear_output), replayable with ``.display()``."""

    def __init__(self, message):
        self.message = message

    @property
    def data(self):
        return self.message.get("data", {})

    @property
    def metadata(self):
        return self.message.get("metadata", {})

    def display(self):
        if self.message["op"] == "clear":
            _wasm_kernel.call_host("clear", wait=self.message.get("wait", False))
            return
        # a captured execute_result is replayed as display data, as IPython does
        _wasm_kernel.call_host(
            "display",
            data=self.data,
            metadata=self.metadata,
            transient=self.message.get("transient", {}),
            update=self.message.get("update", False),
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.data, self.metadata


class CapturedIO:
    """Captured stdout, stderr and rich outputs of a block or cell."""

    def __init__(self, stdout, stderr, outputs):
        self._stdout, self._stderr, self._outputs = stdout, stderr, outputs

    def __str__(self):
        return self.stdout

    @property
    def stdout(self):
        return self._stdout.getvalue() if self._stdout else ""

    @property
    def stderr(self):
        return self._stderr.getvalue() if self._stderr else ""

    @property
    def outputs(self):
        return [RichOutput(message) for message in self._outputs]

    def show(self):
        """Replay everything that was captured, in kind: streams, then rich outputs."""
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)
        for output in self.outputs:
            output.display()

    __call__ = show


class capture_output:
    """Context manager capturing stdout, stderr and display output."""

    def __init__(self, stdout=True, stderr=True, display=True):
        self.stdout, self.stderr, self.display = stdout, stderr, display

    def __enter__(self):
        self._saved = sys.stdout, sys.stderr
        out = io.StringIO() if self.stdout else None
        err = io.StringIO() if self.stderr else None
        outputs = []
        if out:
            sys.stdout = out
        if err:
            sys.stderr = err
        if self.display:
            _wasm_kernel.capture_stack.append(outputs)
        self._outputs = outputs
        return CapturedIO(out, err, outputs)

    def __exit__(self, *exc_info):
        sys.stdout, sys.stderr = self._saved
        if self.display:
            _wasm_kernel.capture_stack.remove(self._outputs)
        return False
