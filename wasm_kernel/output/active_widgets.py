"""The active-output policy for widgets: a widget's state is data from the guest that the
front end turns into DOM, so under ``block`` it passes the same sanitizers as a display.

What ``@jupyter-widgets`` (the front end ``jupyterlab_widgets`` ships) renders as HTML:

- the ``value`` of the ``HTML`` and ``HTMLMath`` widgets (set as ``innerHTML``, unsanitized);
- any widget's ``description`` while ``description_allow_html`` is true;
- the ``outputs`` of the ``Output`` widget: mime bundles, rendered as any display.

Those are cleaned here (``active_html``, ``ActiveOutput.bundle``). Widget models from any other
front-end module are refused under ``block``, at their comm_open and in any update that would
switch a model's ``_model_module`` or ``_view_module`` to one: their code is not part of that
reviewed set, and some run code that their state carries (anywidget's ``_esm``, refused in any
widget's state). Comms that are not
widgets reach only front-end code the operator installed, with data it must treat as such:
they pass. Under ``allow`` nothing changes.

The host remembers, per open comm, its model and its description's state, so that an update
carrying only ``value`` or turning ``description_allow_html`` on is judged like the first
state; comms it never saw opened (past ``MAX_TRACKED``, or from a resumed image) are judged
as if they were HTML widgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .active_output import ActiveOutput

WIDGET_TARGET = "jupyter.widget"
STANDARD_MODULES = frozenset(
    {"@jupyter-widgets/base", "@jupyter-widgets/controls", "@jupyter-widgets/output"}
)
CODE_KEYS = frozenset({"_esm"})  # state that front ends such as anywidget run as code
HTML_VALUE_MODELS = frozenset({"HTMLModel", "HTMLMathModel"})
MAX_TRACKED = 10_000  # open comms the host remembers; the rest are judged strictly
DESCRIPTION_LIMIT = 64 * 1024  # characters of a description kept to re-send when it turns HTML


@dataclass
class Widget:
    model: str = ""  # "" : unknown, judged as an HTML widget
    html_description: bool = True
    description: str = ""


class WidgetPolicy:
    """What the kernel knows of the session's widgets, for the policy. One per kernel: widgets
    outlive the cell that made them."""

    def __init__(self) -> None:
        self._widgets: dict[str, Widget] = {}

    def opened_by_client(self, comm_id: str) -> None:
        """A comm the front end opened (ipywidgets' control comm): no HTML widget."""
        self._remember(comm_id, Widget(model="(front end)", html_description=False))

    def closed(self, comm_id: str) -> None:
        self._widgets.pop(comm_id, None)

    def outgoing(self, msg_type: str, content: dict, active: ActiveOutput) -> str:
        """Make a comm message from the guest passive in place, under block; returns why it
        is refused ("": it may go)."""
        comm_id = content["comm_id"]
        if msg_type == "comm_close":
            self.closed(comm_id)
            return ""
        if not active.blocking:
            return ""
        data = content.get("data")
        state = data.get("state") if isinstance(data, dict) else None
        if msg_type == "comm_open" and content.get("target_name") != WIDGET_TARGET:
            return ""
        if isinstance(state, dict):  # at its comm_open, or in any update after it
            refusal = _front_end_code(state)
            if refusal:
                return refusal
        if msg_type == "comm_open":
            state = state if isinstance(state, dict) else {}
            self._remember(
                comm_id, Widget(model=str(state.get("_model_name")), html_description=False)
            )
        if isinstance(state, dict):
            widget = self._widgets.get(comm_id) or Widget()
            _clean_state(widget, state, active)
        states = data.get("states") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(states, dict):  # the control comm's answer
            data["states"] = self._passive_states(states, active)
        return ""

    def _passive_states(self, states: dict, active: ActiveOutput) -> dict:
        """ipywidgets' ``update_states``: each model's state judged as at its comm_open."""
        kept = {}
        for model_id, entry in states.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("state"), dict):
                continue
            state = entry["state"]
            if _front_end_code({"_model_module": entry.get("model_module"), **state}):
                continue  # as at its comm_open: not sent
            widget = self._widgets.get(model_id) or Widget(model=str(entry.get("model_name")))
            _clean_state(Widget(widget.model), state, active)
            kept[model_id] = entry
        return kept

    def _remember(self, comm_id: str, widget: Widget) -> None:
        if comm_id in self._widgets or len(self._widgets) < MAX_TRACKED:
            self._widgets[comm_id] = widget


def _front_end_code(state: dict) -> str:
    """Why a widget's state (at its comm_open, or an update) would bring front-end code the
    policy has not reviewed: a module outside jupyterlab_widgets', or code carried as state
    ("": it brings none)."""
    for key in ("_model_module", "_view_module"):
        module = state.get(key)
        if module is not None and module not in STANDARD_MODULES:
            return (
                f"the widget's front-end module {str(module)[:100]!r} is not one of"
                " jupyterlab_widgets' standard widgets, so it could run code in the browser:"
                " this kernel blocks active output (WasmKernel.active_output=allow shows it)"
            )
    carried = sorted(CODE_KEYS.intersection(state))
    if carried:
        return (
            f"the widget's state carries front-end code ({', '.join(carried)}), which the"
            " browser would run: this kernel blocks active output"
            " (WasmKernel.active_output=allow shows it)"
        )
    return ""


def _clean_state(widget: Widget, state: dict, active: ActiveOutput) -> None:
    """Clean, in place, what of ``state`` the front end renders as HTML."""
    if isinstance(state.get("value"), str) and widget.model in ("", *HTML_VALUE_MODELS):
        state["value"] = _clean(state["value"], active)
    if "description_allow_html" in state:
        turned_on = bool(state["description_allow_html"]) and not widget.html_description
        widget.html_description = bool(state["description_allow_html"])
        if turned_on and "description" not in state:  # the text already shown becomes HTML
            state["description"] = widget.description
    if isinstance(state.get("description"), str):
        widget.description = state["description"][:DESCRIPTION_LIMIT]
        if widget.html_description:
            state["description"] = _clean(state["description"], active)
    outputs = state.get("outputs")
    if isinstance(outputs, list):
        state["outputs"] = [_passive_output(output, active) for output in outputs]


def _clean(text: str, active: ActiveOutput) -> str:
    cleaned = active.bundle({"text/html": text}).get("text/html")
    return cleaned if isinstance(cleaned, str) else ""


def _passive_output(output: Any, active: ActiveOutput) -> Any:
    """One of the Output widget's outputs (an nbformat output) with its bundle made passive."""
    if isinstance(output, dict) and isinstance(output.get("data"), dict):
        return {**output, "data": active.bundle(output["data"])}
    return output
