"""display(), update_display(), clear_output() and DisplayHandle for wasm-kernel's sandbox.

The same signatures and behaviour as IPython's functions of these names; output goes to the
kernel through ``_wasm_kernel.call_host`` as display_data, update_display_data and
clear_output messages.
"""

import os

from _wasm_kernel import call_host, mime_bundle

__all__ = ["DisplayHandle", "clear_output", "display", "publish_display_data", "update_display"]


def _new_id():
    """A fresh display id: 32 random hex digits, like IPython's uuid4().hex."""
    return os.urandom(16).hex()


def _wire_value(mime, value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (str, dict, list)):
        return value
    if mime.endswith("json") and (value is None or isinstance(value, (bool, int, float))):
        return value  # JSON mime types may hold any JSON value
    raise TypeError(
        f"cannot display {type(value).__name__} as {mime!r}: "
        "a mime bundle's values must be str, bytes, dict or list (any JSON value for JSON types)"
    )


def _wire_bundle(data):
    """Check a mime bundle before it leaves the sandbox (the kernel refuses malformed ones)."""
    if not isinstance(data, dict):
        raise TypeError(
            f"display data must be a dict of mime type -> data, not {type(data).__name__}"
        )
    bundle = {}
    for mime, value in data.items():
        if not isinstance(mime, str) or "/" not in mime:
            raise ValueError(f"{mime!r} is not a mime type")
        bundle[mime] = _wire_value(mime, value)
    return bundle


def _merge(base, extra):
    """Merge ``extra`` into ``base`` key by key, nested dicts too; ``extra`` wins."""
    if not isinstance(base, dict) or not isinstance(extra, dict):
        return extra
    for key, value in extra.items():
        base[key] = _merge(base.get(key), value)
    return base


def publish_display_data(data, metadata=None, *, transient=None, update=False, **kwargs):
    """Publish a raw mime bundle: ``data`` maps mime types to their representation."""
    if "source" in kwargs:
        kwargs.pop("source")  # accepted and ignored, as IPython has done for years
    if kwargs:
        raise TypeError(
            f"publish_display_data() got unexpected keyword arguments: {', '.join(kwargs)}"
        )
    metadata = {} if metadata is None else metadata
    transient = {} if transient is None else transient
    for name, value in (("metadata", metadata), ("transient", transient)):
        if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
            raise TypeError(f"{name} must be a dict with str keys")
    data = _wire_bundle(data)
    if not data:
        return
    display_id = transient.get("display_id")
    if display_id is not None and not isinstance(display_id, str):
        raise TypeError(f"display_id must be a str, not {type(display_id).__name__}")
    if update and display_id is None:
        raise TypeError("display_id required for update_display")
    call_host("display", data=data, metadata=metadata, transient=transient, update=bool(update))


def _custom_display(obj):
    """Call ``obj._ipython_display_()`` if it has one; True when it took over the display."""
    if isinstance(obj, type):
        return False
    method = getattr(obj, "_ipython_display_", None)
    if not callable(method):
        return False
    method()
    return True


def display(
    *objs,
    include=None,
    exclude=None,
    metadata=None,
    transient=None,
    display_id=None,
    raw=False,
    clear=False,
    **kwargs,
):
    """Show each object with its richest representations, as IPython.display.display does.

    ``raw=True`` takes each object as a ready mime bundle (a dict of mime type -> data).
    ``display_id`` (or ``True`` for a new one) makes the output updatable and returns a
    DisplayHandle; ``update=True`` replaces earlier outputs with that id instead of adding
    one. ``clear=True`` clears the output area first (when the new output arrives).
    """
    transient = {} if transient is None else dict(transient)
    if display_id:
        if display_id is True:
            display_id = _new_id()
        transient["display_id"] = display_id
    if kwargs.get("update") and "display_id" not in transient:
        raise TypeError("display_id required for update_display")
    if transient:
        kwargs["transient"] = transient

    if not objs and display_id:
        return DisplayHandle(display_id)  # a handle for later, nothing shown yet
    if clear:
        clear_output(wait=True)

    for obj in objs:
        if raw:
            publish_display_data(obj, metadata=metadata, **kwargs)
            continue
        if _custom_display(obj):
            continue
        data, meta = mime_bundle(obj, include, exclude)
        if not data:
            continue  # nothing left after include/exclude
        if metadata:
            _merge(meta, metadata)
        publish_display_data(data, metadata=meta, **kwargs)
    return DisplayHandle(display_id) if display_id else None


def update_display(obj, *, display_id, **kwargs):
    """Replace the outputs shown with ``display_id`` by ``obj``."""
    kwargs["update"] = True
    display(obj, display_id=display_id, **kwargs)


class DisplayHandle:
    """A handle on an updatable display.

    ``.update(obj)`` replaces the outputs with its id; ``.display(obj)`` adds one more.
    """

    def __init__(self, display_id=None):
        self.display_id = _new_id() if display_id is None else display_id

    def __repr__(self):
        return f"<{type(self).__name__} display_id={self.display_id}>"

    def display(self, obj, **kwargs):
        """Show ``obj`` as a new output carrying this handle's display id."""
        display(obj, display_id=self.display_id, **kwargs)

    def update(self, obj, **kwargs):
        """Replace every output with this handle's display id by ``obj``."""
        update_display(obj, display_id=self.display_id, **kwargs)


def clear_output(wait=False):
    """Clear the cell's output area; with ``wait=True``, only once new output arrives."""
    call_host("clear", wait=bool(wait))
