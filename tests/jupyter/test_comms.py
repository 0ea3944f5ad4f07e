"""Comms both ways, through jupyter_client, against the native ipykernel in the same test.

A client opens, messages and closes comms as JupyterLab's widget manager does (shell messages
with buffers) and reads what the kernel publishes on IOPub; the same steps run on the native
kernel (the ``python3`` kernelspec) and the comm messages are compared, comm ids normalised.
Then what only the sandbox has: limits on handlers (time, rollback, output), floods both ways,
the active-output policy on widget state, and comms across a hibernation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from conftest import CellRun, Kernel, ok

from wasm_kernel.guest.modules._wasm_kernel_contract import COMM_RECEIVED_LIMIT

pytestmark = pytest.mark.slow  # kernels, and a native one beside each

NATIVE = "python3"
COMM_TYPES = ("comm_open", "comm_msg", "comm_close")
HEX_ID = re.compile(r"\b[0-9a-f]{32}\b")

ECHO = """
import comm

def on_open(c, msg):
    c.send({"opened": msg["content"]["data"]}, buffers=[b"open-" + bytes(msg["buffers"][0])])

    @c.on_msg
    def echo(msg):
        c.send({"echo": msg["content"]["data"]}, buffers=[bytes(b)[::-1] for b in msg["buffers"]])
        print("handled", msg["content"]["data"])

    c.on_close(lambda msg: print("closed by the client"))

comm.get_comm_manager().register_target("echo", on_open)
mine = comm.create_comm(target_name="kernel-side", data={"hello": 1}, buffers=[b"\\x00\\x01"])
mine.send({"x": 2}, buffers=[memoryview(b"abc")])
mine.close({"bye": True})
"""


def send(
    kernel: Kernel, msg_type: str, content: dict, buffers: list[bytes] = (), metadata: Any = None
) -> str:
    """A shell message as a front end sends it; returns its id."""
    client = kernel.client
    message = client.session.msg(msg_type, content, metadata=metadata)
    client.session.send(client.shell_channel.socket, message, buffers=list(buffers))
    return message["header"]["msg_id"]


def collect(kernel: Kernel, msg_id: str, timeout: float = 60) -> CellRun:
    """IOPub messages of a request that gets no reply (comm messages), until idle."""
    run = CellRun(reply={})
    deadline = time.monotonic() + timeout
    while True:
        msg = kernel.client.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status":
            if msg["content"]["execution_state"] == "idle":
                return run
            continue
        run.messages.append(msg)


def shown(run: CellRun, request: str = "") -> list[tuple]:
    """What a request published of comms and stdout, comm ids numbered in order of appearance
    (and the id of the ``request`` itself named so)."""
    ids: dict[str, str] = {}

    def same(value: Any) -> Any:
        if isinstance(value, str) and request and value == request:
            return "<request>"
        if isinstance(value, str):
            return HEX_ID.sub(lambda m: ids.setdefault(m.group(), f"<id{len(ids)}>"), value)
        if isinstance(value, dict):
            return {key: same(item) for key, item in value.items()}
        if isinstance(value, list):
            return [same(item) for item in value]
        return value

    kept = []
    for msg in run.messages:
        kind, content = msg["msg_type"], msg["content"]
        if kind in COMM_TYPES:
            buffers = [bytes(buffer) for buffer in msg.get("buffers", [])]
            kept.append((kind, same(content), msg["metadata"], buffers))
        elif kind == "stream" and content["name"] == "stdout":
            kept.append((kind, content["text"]))
        elif kind == "error":
            kept.append((kind, content["ename"], content["evalue"]))
    return kept


def comm_messages(run: CellRun, msg_type: str) -> list[dict]:
    return [m["content"] for m in run.messages if m["msg_type"] == msg_type]


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Kernel, Kernel]]:
    """The sandbox and the native kernel, side by side."""
    ours, native = Kernel(), Kernel(kernel_name=NATIVE)
    yield ours, native
    ours.shutdown()
    native.shutdown()


def both(pair: tuple[Kernel, Kernel], act: Any) -> tuple[Any, Any]:
    return act(pair[0]), act(pair[1])


def test_comms_both_ways_with_buffers(pair):
    """A comm opened in the kernel, a target the client opens, messages and buffers both
    ways, comm_info, a close from the client and a target nobody registered: as natively."""
    ours, native = both(pair, lambda k: ok(k.execute(ECHO)))
    assert shown(ours) == shown(native)
    opened = comm_messages(ours, "comm_open")[0]
    assert opened["target_name"] == "kernel-side" and opened["data"] == {"hello": 1}
    first = next(m for m in ours.messages if m["msg_type"] == "comm_open")
    assert [bytes(b) for b in first["buffers"]] == [b"\x00\x01"]
    # every comm message of the cell went out under the cell's request
    assert {m["parent_header"]["msg_id"] for m in ours.messages} == {
        ours.reply["parent_header"]["msg_id"]
    }

    steps = [
        ("comm_open", {"comm_id": "c" * 32, "target_name": "echo", "data": {"a": 1}}, [b"xy"]),
        ("comm_msg", {"comm_id": "c" * 32, "data": {"n": 2}}, [b"abc", b"de"]),
        ("comm_info_request", {}, []),
        ("comm_close", {"comm_id": "c" * 32, "data": {}}, []),
        ("comm_open", {"comm_id": "d" * 32, "target_name": "nobody", "data": {}}, []),
    ]
    for msg_type, content, buffers in steps:
        if msg_type == "comm_info_request":
            infos = both(
                pair, lambda k: k.client.comm_info(reply=True, timeout=30)["content"]["comms"]
            )
            assert infos[0] == infos[1] == {"c" * 32: {"target_name": "echo"}}
            continue
        runs = both(pair, lambda k, m=(msg_type, content, buffers): collect(k, send(k, *m)))
        assert shown(runs[0]) == shown(runs[1]), msg_type
    # the unknown target: ipykernel's answer, a comm_close
    assert [m[0] for m in shown(runs[0])] == ["comm_close"]
    after = both(pair, lambda k: k.client.comm_info(reply=True, timeout=30)["content"]["comms"])
    assert after == ({}, {})


def test_a_handler_that_raises_shows_its_traceback_as_natively(pair):
    """ipywidgets' callbacks show their traceback (an error under the comm message)."""
    cell = (
        "import ipywidgets as w\n"
        "b = w.Button(description='go')\n"
        "b.on_click(lambda _: 1 / 0)\n"
        "b.model_id"
    )
    runs = both(pair, lambda k: ok(k.execute(cell)))
    for kernel, run in zip(pair, runs, strict=True):
        model = eval(run.result_text())
        click = {"comm_id": model, "data": {"method": "custom", "content": {"event": "click"}}}
        errors = [
            (m["content"]["ename"], m["content"]["evalue"])
            for m in collect(kernel, send(kernel, "comm_msg", click)).messages
            if m["msg_type"] == "error"
        ]
        assert errors == [("ZeroDivisionError", "division by zero")]


def test_interact_output_goes_to_its_output_widget(pair):
    """interact's function runs on a slider move; its print and clear_output go out under
    the comm message (the Output widget captures by that id), as natively."""
    cell = (
        "from ipywidgets import interact\n"
        "shown = interact(lambda x: print('twice', 2 * x), x=5)\n"
        "shown.widget.children[0].model_id"
    )
    runs = both(pair, lambda k: ok(k.execute(cell)))
    moved, requests = [], []
    for kernel, run in zip(pair, runs, strict=True):
        slider = eval(run.result_text())
        update = {"method": "update", "state": {"value": 7}, "buffer_paths": []}
        requests.append(send(kernel, "comm_msg", {"comm_id": slider, "data": update}))
        moved.append(collect(kernel, requests[-1]))
    kinds = [[m["msg_type"] for m in run.messages if m["msg_type"] != "comm_msg"] for run in moved]
    assert kinds[0] == kinds[1] and "stream" in kinds[0], kinds
    assert [m[1] for m in shown(moved[0]) if m[0] == "stream"] == ["twice 14\n"]
    # the Output widget was told to capture this request's output, by its id
    assert shown(moved[0], requests[0]) == shown(moved[1], requests[1])
    assert "<request>" in str(shown(moved[0], requests[0]))


def test_a_comm_message_during_a_cell_leaves_the_next_cell_its_own_status(pair):
    """JupyterLab's Run All and then a slider drag: a comm message arrives while a cell runs,
    with the next cell queued behind it. Each cell must end in its own reply and idle status
    (JupyterLab draws the prompt only once both came), the comm handled between them."""
    cell = "import ipywidgets as w\nslider = w.IntSlider()\nslider.model_id"
    moved = {"method": "update", "state": {"value": 3}, "buffer_paths": []}
    for kernel in pair:
        model = eval(ok(kernel.execute(cell)).result_text())
        slow = kernel.client.execute("import time\ntime.sleep(1.5)\nprint('slow done')")
        time.sleep(0.5)  # the cell has begun
        send(kernel, "comm_msg", {"comm_id": model, "data": moved})
        after = kernel.client.execute("print('next sees', slider.value)")
        assert ok(kernel.collect(slow, timeout=60)).stream_text() == "slow done\n"
        assert ok(kernel.collect(after, timeout=60)).stream_text() == "next sees 3\n"


# -- limits ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def limited() -> Iterator[Kernel]:
    kernel = Kernel(
        [
            "--WasmKernel.time_limit=3",
            "--WasmKernel.interrupt_grace=1",
            "--WasmKernel.output_limit=200000",
        ]
    )
    ok(
        kernel.execute(
            "import comm, time\n"
            "state = {'n': 0}\n"
            "def on_open(c, msg):\n"
            "    @c.on_msg\n"
            "    def handle(msg):\n"
            "        state['n'] += 1\n"
            "        what = msg['content']['data']['do']\n"
            "        if what == 'loop':\n"
            "            while True: pass\n"
            "        if what == 'stubborn':\n"
            "            while True:\n"
            "                try:\n"
            "                    time.sleep(10)\n"
            "                except BaseException:\n"
            "                    pass\n"
            "        if what == 'flood':\n"
            "            while True: c.send({'x': 'y' * 1000})\n"
            "        c.send({'n': state['n']})\n"
            "comm.get_comm_manager().register_target('work', on_open)\n"
        )
    )
    collect(
        kernel, send(kernel, "comm_open", {"comm_id": "w" * 32, "target_name": "work", "data": {}})
    )
    yield kernel
    kernel.shutdown()


def work(kernel: Kernel, do: str) -> CellRun:
    return collect(kernel, send(kernel, "comm_msg", {"comm_id": "w" * 32, "data": {"do": do}}))


def errors(run: CellRun) -> list[dict]:
    return [m["content"] for m in run.messages if m["msg_type"] == "error"]


def test_a_handler_that_loops_is_stopped_by_the_time_limit(limited):
    run = work(limited, "loop")
    assert [e["ename"] for e in errors(run)] == ["TimeLimitExceeded"]
    assert comm_messages(work(limited, "count"), "comm_msg")[0]["data"]["n"] >= 2


def test_an_interrupt_stops_a_handler(limited):
    """Jupyter's interrupt reaches a comm handler as it reaches a cell."""
    msg_id = send(limited, "comm_msg", {"comm_id": "w" * 32, "data": {"do": "loop"}})
    time.sleep(0.5)
    limited.manager.interrupt_kernel()
    assert [e["ename"] for e in errors(collect(limited, msg_id))] == ["KeyboardInterrupt"]
    assert comm_messages(work(limited, "count"), "comm_msg")


def test_a_handler_that_ignores_the_limit_is_stopped_hard_and_rolled_back(limited):
    before = comm_messages(work(limited, "count"), "comm_msg")[0]["data"]["n"]
    run = work(limited, "stubborn")
    [error] = errors(run)
    assert error["ename"] == "TimeLimitExceeded" and "rolled back" in error["evalue"]
    # its state['n'] += 1 was rolled back; the comm and the kernel work
    assert comm_messages(work(limited, "count"), "comm_msg")[0]["data"]["n"] == before + 1
    assert ok(limited.execute("state['n']")).result_text() == str(before + 1)


def test_a_flood_of_comm_messages_from_the_guest_ends_in_a_clear_error(limited):
    """Comm messages count against the output budget: a cell that floods fails with
    CommNotSent; a handler that floods is told on stderr (comm's manager logs what escapes a
    handler, as ipykernel's does); the next message is handled."""
    run = limited.execute(
        "c = comm.create_comm(target_name='x')\nwhile True: c.send({'x': 'y' * 1000})"
    )
    assert run.content["status"] == "error" and run.content["ename"] == "CommNotSent"
    assert "output limit" in run.content["evalue"]
    assert 0 < len(comm_messages(run, "comm_msg")) < 200_000 // 1000
    run = work(limited, "flood")
    assert 0 < len(comm_messages(run, "comm_msg")) < 200_000 // 1000
    assert "output limit reached" in run.stream_text("stderr")
    assert comm_messages(work(limited, "count"), "comm_msg")  # the next message is fine


def test_a_huge_buffer_from_the_client_is_refused(limited):
    huge = b"\0" * (COMM_RECEIVED_LIMIT + 1)
    message = {"comm_id": "w" * 32, "data": {"do": "count"}}
    run = collect(limited, send(limited, "comm_msg", message, [huge]))
    assert [e["ename"] for e in errors(run)] == ["CommRefused"]
    assert comm_messages(work(limited, "count"), "comm_msg")


@pytest.mark.parametrize(
    "split",
    [
        pytest.param((17 << 20, 0), id="a 17 MiB string in the JSON"),
        pytest.param((COMM_RECEIVED_LIMIT // 2, COMM_RECEIVED_LIMIT // 2 + 1), id="JSON + buffer"),
    ],
)
def test_a_comm_message_over_the_bound_is_refused_before_the_guest(limited, split):
    """The bound is on the whole message (JSON text and buffers together), as the README says:
    the handler never sees it, and the front end's error names the bound."""
    text, binary = split
    before = comm_messages(work(limited, "count"), "comm_msg")[0]["data"]["n"]
    message = {"comm_id": "w" * 32, "data": {"do": "count", "padding": "x" * text}}
    run = collect(limited, send(limited, "comm_msg", message, [b"\0" * binary] if binary else []))
    [error] = errors(run)
    assert error["ename"] == "CommRefused"
    assert f"{COMM_RECEIVED_LIMIT:,} bytes" in error["evalue"]
    assert comm_messages(work(limited, "count"), "comm_msg")[0]["data"]["n"] == before + 1


@pytest.mark.parametrize(
    ("msg_type", "content"),
    [
        ("comm_msg", {"data": {}}),
        ("comm_msg", {"comm_id": "x" * 300, "data": {}}),
        ("comm_open", {"comm_id": "z" * 32, "data": {}}),
        ("comm_close", {"comm_id": 7}),
    ],
)
def test_a_malformed_comm_message_is_refused(limited, msg_type, content):
    run = collect(limited, send(limited, msg_type, content))
    assert [e["ename"] for e in errors(run)] == ["CommRefused"]
    assert comm_messages(work(limited, "count"), "comm_msg")


def test_a_client_flood_does_not_hold_cells_back(limited):
    """Thousands of comm messages at once: those that waited past comms.QUEUED behind the
    others are dropped, with a notice; a cell sent after them runs, and memory stays bounded.

    Every comm message is a request with its busy and idle status, as under ipykernel, so this
    client, which reads no IOPub meanwhile, loses IOPub messages past ZMQ's high-water mark
    (the native kernel's next cell lost its outputs the same way): the checks read replies."""
    process = psutil.Process(limited.manager.provisioner.process.pid)
    before = process.memory_info().rss
    client = limited.client
    flood = 5000
    for _ in range(flood):
        message = client.session.msg("comm_msg", {"comm_id": "e" * 32, "data": {"x": "y" * 1000}})
        client.shell_channel.send(message)
    start = time.monotonic()
    assert shell_value(limited, "1 + 1") == "2"
    grown = (process.memory_info().rss - before) / 2**20
    print(
        f"a cell behind {flood} comm messages: {time.monotonic() - start:.1f} s, +{grown:.0f} MiB"
    )
    assert grown < 200
    handled = shell_value(limited, "state['n']")
    client.shell_channel.send(
        client.session.msg("comm_msg", {"comm_id": "w" * 32, "data": {"do": "count"}})
    )
    assert shell_value(limited, "state['n']") == str(int(handled) + 1)


def shell_value(kernel: Kernel, expression: str) -> str:
    """``expression``'s value from an execute_reply's user_expressions (the shell channel)."""
    sent = kernel.client.execute("", user_expressions={"value": expression})
    reply = kernel.client.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != sent:
        reply = kernel.client.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    return reply["content"]["user_expressions"]["value"]["data"]["text/plain"]


# -- the active-output policy ------------------------------------------------------------------

HOSTILE = '<b>bold</b><img src=x onerror="document.body.dataset.pwned=1"><script>alert(1)</script>'


def test_widget_state_passes_the_policy(start_kernel):
    blocked = start_kernel()
    allowed = start_kernel(["--WasmKernel.active_output=allow"])
    cell = (
        "import ipywidgets as w\n"
        f"h = w.HTML(value={HOSTILE!r})\n"
        f"s = w.IntSlider(description={HOSTILE!r}, description_allow_html=True)\n"
        "t = w.Text(value='a<b')\n"
        "h.value = h.value + '<i>more</i>'\n"
        f"flip = w.Checkbox(description={HOSTILE!r})\n"
        "flip.description_allow_html = True\n"
        "from IPython.display import HTML\n"
        "o = w.Output()\n"
        f"o.append_display_data(HTML({HOSTILE!r}))\n"
    )
    state = {}
    for name, kernel in (("blocked", blocked), ("allowed", allowed)):
        run = ok(kernel.execute(cell))
        opened = [c["data"]["state"] for c in comm_messages(run, "comm_open")]
        updates = [c["data"].get("state", {}) for c in comm_messages(run, "comm_msg")]
        state[name] = (opened, updates, run.stream_text("stderr"))
    opened, updates, told = state["blocked"]
    html = next(s for s in opened if s["_model_name"] == "HTMLModel")
    assert "<b>bold</b>" in html["value"] and "onerror" not in html["value"]
    assert "<script" not in html["value"]
    slider = next(s for s in opened if s["_model_name"] == "IntSliderModel")
    assert "onerror" not in slider["description"] and "<b>bold</b>" in slider["description"]
    text = next(s for s in opened if s["_model_name"] == "TextModel")
    assert text["value"] == "a<b"  # not HTML: left as it is
    later = [u["value"] for u in updates if "value" in u]
    assert later and all("onerror" not in v and "<i>more</i>" in v for v in later)
    # a description turned into HTML later is sent again, cleaned, with the flag
    [flipped] = [u for u in updates if u.get("description_allow_html")]
    assert "<b>bold</b>" in flipped["description"] and "onerror" not in flipped["description"]
    # the Output widget's bundles pass the policy like any display
    [shown_html] = [out["data"]["text/html"] for u in updates for out in u.get("outputs", ())]
    assert "<b>bold</b>" in shown_html and "onerror" not in shown_html
    assert "active output blocked" in told
    opened, updates, told = state["allowed"]
    html = next(s for s in opened if s["_model_name"] == "HTMLModel")
    assert html["value"] == HOSTILE and "blocked" not in told
    [shown_html] = [out["data"]["text/html"] for u in updates for out in u.get("outputs", ())]
    assert shown_html == HOSTILE

    custom = (
        "import ipywidgets as w, traitlets\n"
        "class Mine(w.DOMWidget):\n"
        "    _model_module = traitlets.Unicode('my-widgets').tag(sync=True)\n"
        "    _view_module = traitlets.Unicode('my-widgets').tag(sync=True)\n"
        "Mine()"
    )
    run = blocked.execute(custom)
    assert run.content["status"] == "error" and run.content["ename"] == "CommNotSent"
    assert "my-widgets" in run.content["evalue"]
    modules = [c["data"]["state"]["_model_module"] for c in comm_messages(run, "comm_open")]
    assert modules and "my-widgets" not in modules  # its layout's went out, not it
    assert comm_messages(ok(allowed.execute(custom)), "comm_open")


ESM = "export default { render() { document.body.dataset.pwned = 1 } }"


def test_an_update_may_not_switch_a_widget_to_front_end_code_the_policy_refuses(start_kernel):
    """Under block, what is refused at a widget's comm_open is refused in its updates too: a
    module outside jupyterlab_widgets' (traitlets set as ipywidgets does, or a raw update
    crafted here) or anywidget's front-end code (``_esm``) on a standard widget. Nothing of it
    leaves the kernel; the widget's ordinary updates still go out. Under allow it goes out.
    (No front end here could run anywidget's code, so the messages are what is checked.)"""
    blocked = start_kernel()
    allowed = start_kernel(["--WasmKernel.active_output=allow"])
    setup = "import ipywidgets as w\ns = w.IntSlider()"
    switches = {
        "traitlets": "s._view_module = 'anywidget'",
        "update": (
            "s.comm.send({'method': 'update', 'buffer_paths': [], 'state': {"
            f"'_model_module': 'anywidget', '_view_module': 'anywidget', '_esm': {ESM!r}}}}})"
        ),
        "esm only": (
            f"s.comm.send({{'method': 'update', 'buffer_paths': [], 'state': {{'_esm': {ESM!r}}}}})"
        ),
    }
    ok(blocked.execute(setup))
    ok(allowed.execute(setup))
    for how, code in switches.items():
        run = blocked.execute(code)
        assert run.content["status"] == "error", how
        assert run.content["ename"] == "CommNotSent", how
        sent = [c["data"].get("state", {}) for c in comm_messages(run, "comm_msg")]
        assert not any("_esm" in state or "anywidget" in state.values() for state in sent), (
            how,
            sent,
        )
        assert comm_messages(ok(allowed.execute(code)), "comm_msg"), how
    moved = comm_messages(ok(blocked.execute("s.value = 7")), "comm_msg")
    assert [c["data"]["state"] for c in moved] == [{"value": 7}]


# -- hibernation -------------------------------------------------------------------------------


def test_widgets_outlive_a_hibernation(tmp_path):
    """The guest's side of open widgets is part of the hibernated image: after the resume, a
    front end's widget manager that asks for the widgets' state (as JupyterLab's does when it
    connects) gets them back, cleaned by the policy, and moving the slider runs its handler.
    (A native kernel restarted has none: its widgets show "model not found".)"""
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path), "JPY_SESSION_NAME": "widgets.ipynb"}
    first = Kernel(env=env)
    try:
        run = ok(
            first.execute(
                "import ipywidgets as w\n"
                "s = w.IntSlider(value=3)\n"
                "s.observe(lambda change: print('now', change['new']), 'value')\n"
                f"h = w.HTML({HOSTILE!r})\n"
                "s.model_id, h.model_id"
            )
        )
        model, html = eval(run.result_text())
    finally:
        first.shutdown()
    second = Kernel(env=env)
    try:
        ok(second.execute("None"))  # resumed
        control = {
            "comm_id": "f" * 32,
            "target_name": "jupyter.widget.control",
            "data": {},
        }
        collect(second, send(second, "comm_open", control, metadata={"version": "1.0.0"}))
        asked = collect(
            second,
            send(second, "comm_msg", {"comm_id": "f" * 32, "data": {"method": "request_states"}}),
        )
        [states] = comm_messages(asked, "comm_msg")
        assert states["data"]["states"][model]["state"]["value"] == 3
        # the policy holds for the states sent again (the default, block)
        value = states["data"]["states"][html]["state"]["value"]
        assert "<b>bold</b>" in value and "onerror" not in value
        update = {"method": "update", "state": {"value": 9}, "buffer_paths": []}
        moved = collect(second, send(second, "comm_msg", {"comm_id": model, "data": update}))
        assert "now 9" in "".join(
            m["content"]["text"] for m in moved.messages if m["msg_type"] == "stream"
        )
    finally:
        second.shutdown()


def test_widgets_after_a_snapshot_restore_are_the_image_s(start_kernel, tmp_path):
    """%snapshot restore brings back the widgets the image holds, working; one made after
    the save is gone (its messages are logged as for an unknown comm). The strict profile
    (no snapshots) has ipywidgets too."""
    strict = start_kernel(kernel_name="wasm-python-strict")
    assert ok(strict.execute("import ipywidgets as w\nw.IntSlider(4).value")).result_text() == "4"
    kernel = start_kernel(env={"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path)})
    saved = ok(
        kernel.execute(
            "import ipywidgets as w\n"
            "s = w.IntSlider(value=3)\n"
            "s.observe(lambda change: print('now', change['new']), 'value')\n"
            "%snapshot save widgets\n"
            "s.model_id"
        )
    )
    model = eval(saved.result_text())
    later = eval(ok(kernel.execute("w.IntSlider().model_id")).result_text())
    ok(kernel.execute("%snapshot restore widgets"))

    def move(comm_id: str) -> CellRun:
        update = {"method": "update", "state": {"value": 9}, "buffer_paths": []}
        return collect(kernel, send(kernel, "comm_msg", {"comm_id": comm_id, "data": update}))

    assert "now 9" in move(model).stream_text()
    assert "No such comm" in move(later).stream_text("stderr")
