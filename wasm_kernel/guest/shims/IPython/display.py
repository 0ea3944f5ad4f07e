"""IPython.display for wasm-kernel's sandbox: rich output through the kernel's host channel."""

import time

from _wasm_kernel import call_host, mime_bundle

def display(*objs, raw=False, include=None, exclude=None, metadata=None, transient=None,
            display_id=None, update=False, clear=False):
    """Send each object as display_data, like IPython.display.display."""
    if display_id is True:
        display_id = _new_display_id()
    if clear:
        clear_output(wait=True)
    for obj in objs:
        if raw:
            data, meta = obj, {}
        else:
            data, meta = mime_bundle(obj, include, exclude)
        meta.update(metadata or {})
        extra = dict(transient or {})
        if display_id:
            extra["display_id"] = display_id
        call_host("display", data=data, metadata=meta, transient=extra, update=bool(update))
    return DisplayHandle(display_id) if display_id else None


_display_counter = [0]


def _new_display_id():
    _display_counter[0] += 1
    return f"wasm-{time.time_ns():x}-{_display_counter[0]}"


class DisplayHandle:
    def __init__(self, display_id=None):
        self.display_id = display_id or _new_display_id()

    def __repr__(self):
        return f"<DisplayHandle display_id={self.display_id}>"

    def display(self, obj, **kwargs):
        display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj, **kwargs):
        display(obj, display_id=self.display_id, update=True, **kwargs)


def clear_output(wait=False):
    """Clear the output area (after the next output arrives when ``wait``)."""
    call_host("clear", wait=bool(wait))


