"""JupyterLab's visual debugger: the Debug Adapter Protocol over debug_request/debug_reply on
the control channel and debug_event on IOPub, against the native ipykernel (debugpy) in the
same test.

The same sequence the panel sends (initialize, attach, dumpCell, setBreakpoints,
configurationDone, a cell that stops at the breakpoint, stackTrace, scopes, variables, next,
continue, inspectVariables) must give answers and events of the same shape, with the same
meaningful values: the stopped lines, the frames' names, the variables' names and values.
Numbers that are debugpy's own (ids, sequence numbers) are compared by kind only.
"""

from __future__ import annotations

import os
import queue
import time
from typing import Any

import pytest
from conftest import Kernel
from ipykernel.compiler import get_tmp_hash_seed, murmur2_x86

from wasm_kernel.guest.modules import _wasm_kernel_cell_files as cell_files

CELL = "def f(a):\n    b = a + 1\n    return b\nx = 5\ny = f(x)\nz = y * 2\n"
BREAKPOINT = 2  # the line of CELL the panel sets a breakpoint on
WAIT = 60  # seconds for any one answer or event


class Panel:
    """What JupyterLab's debugger panel sends one kernel, and what it hears back."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.client = kernel.client
        self.seq = 0
        self.events: list[dict] = []  # debug_events, in order

    def request(self, command: str, **arguments: Any) -> dict:
        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments}
        message = self.client.session.msg("debug_request", content)
        self.client.control_channel.send(message)
        while True:
            reply = self.client.get_control_msg(timeout=WAIT)
            if reply["parent_header"].get("msg_id") == message["header"]["msg_id"]:
                assert reply["msg_type"] == "debug_reply"
                return reply["content"]

    def event(self, name: str) -> dict:
        """The next debug_event ``name`` (earlier ones of other names are kept, not awaited)."""
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                message = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if message["msg_type"] == "debug_event":
                self.events.append(message["content"])
                if message["content"]["event"] == name:
                    return message["content"]
        raise AssertionError(f"no {name} event; heard {[e['event'] for e in self.events]}")

    def start(self, code: str, line: int) -> str:
        """The panel opened on a notebook, a breakpoint set on ``line`` of ``code``: the file
        name it computed for the cell."""
        assert self.request("initialize", clientID="jupyterlab", adapterID="python")["success"]
        assert self.request("attach")["success"]
        path = self.request("dumpCell", code=code)["body"]["sourcePath"]
        self.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": line}])
        assert self.request("configurationDone")["success"]
        return path

    def top_frame(self) -> dict:
        return self.request("stackTrace", threadId=1)["body"]["stackFrames"][0]

    def steps(self, commands: list[str]) -> list[tuple[str, list[tuple[str, int]]]]:
        """Each command, then the stack where it stopped: (function, line) from the top."""
        stops = []
        for command in commands:
            self.request(command, threadId=1)
            self.event("stopped")
            frames = self.request("stackTrace", threadId=1)["body"]["stackFrames"]
            stops.append((command, [(frame["name"], frame["line"]) for frame in frames]))
        return stops

    def reply(self, msg_id: str) -> dict:
        while True:
            reply = self.client.get_shell_msg(timeout=WAIT)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply["content"]


def shape(value: Any) -> Any:
    """The structure of a JSON value: keys and kinds, not the values themselves."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(item) for item in value[:1]]
    return type(value).__name__


def session(kernel: Kernel) -> dict:
    """The panel's whole sequence on one kernel; what it heard, for comparison."""
    panel = Panel(kernel)
    heard: dict[str, Any] = {}
    info = panel.request("debugInfo")
    heard["debugInfo"] = info
    path = panel.start(CELL, BREAKPOINT)
    heard["initialized"] = panel.event("initialized")  # JupyterLab opens its sidebar on it
    heard["exception filters"] = panel.request("setExceptionBreakpoints", filters=[])["success"]
    body = info["body"]
    heard["cell file"] = path.startswith(body["tmpFilePrefix"]) and path.endswith(
        body["tmpFileSuffix"]
    )
    heard["cell name"] = os.path.basename(path)
    heard["breakpoints"] = panel.request("debugInfo")["body"]["breakpoints"]
    msg_id = panel.client.execute(CELL)
    heard["stopped"] = panel.event("stopped")
    trace = panel.request("stackTrace", threadId=1)
    heard["stackTrace"] = trace
    frames = trace["body"]["stackFrames"]
    heard["frames"] = [(frame["name"], frame["line"], frame["source"]["path"]) for frame in frames]
    scopes = panel.request("scopes", frameId=frames[0]["id"])
    heard["scopes"] = scopes
    local = scopes["body"]["scopes"][0]["variablesReference"]
    variables = panel.request("variables", variablesReference=local)
    heard["variables"] = variables
    heard["locals"] = [(v["name"], v["value"], v["type"]) for v in variables["body"]["variables"]]
    evaluated = panel.request("evaluate", expression="a * 10", frameId=frames[0]["id"])
    heard["evaluate"] = evaluated["body"]["result"]
    heard["next"] = panel.request("next", threadId=1)
    heard["continued"] = panel.event("continued")
    heard["stepped"] = panel.event("stopped")
    heard["stepped line"] = panel.top_frame()["line"]
    heard["steps"] = panel.steps(["next"])  # out of f at its return: the caller's next line
    heard["continue"] = panel.request("continue", threadId=1)
    panel.event("continued")
    heard["cell status"] = panel.reply(msg_id)["status"]
    inspected = panel.request("inspectVariables")
    heard["inspectVariables"] = inspected
    heard["names"] = {  # debugpy groups functions and dunders ("", "function" types)
        v["name"]: v["value"]
        for v in inspected["body"]["variables"]
        if v["type"] not in ("", "function")
    }
    heard["rich"] = panel.request("richInspectVariables", variableName="z")["body"]
    heard["disconnect"] = panel.request("disconnect", restart=False, terminateDebuggee=True)
    heard["after"] = panel.request("debugInfo")["body"]["isStarted"]
    return heard


@pytest.mark.parametrize("length", [0, 5, 1003])
def test_a_cells_code_runs_under_the_native_kernels_file_name(
    native_and_ours: tuple[Kernel, Kernel], length: int
) -> None:
    """The host hashes the cell (the guest need not): its code's file is still named as the
    native kernel names it, short or long, ASCII or not."""
    padding = ("# é🐍 padding" * (length // 12 + 1))[:length]
    frame = "__import__('sys')._getframe()"  # no name left behind in the shared kernels
    code = f"print(__import__('os').path.basename({frame}.f_code.co_filename))\n{padding}"
    names = [kernel.execute(code).stream_text() for kernel in native_and_ours]
    assert names[0].endswith(".py\n") and names[0] == names[1]


def test_the_panels_sequence_as_on_the_native_kernel(
    native_and_ours: tuple[Kernel, Kernel],
) -> None:
    native, ours = (session(kernel) for kernel in native_and_ours)
    info, native_info = ours["debugInfo"], native["debugInfo"]
    assert set(info["body"]) == set(native_info["body"])
    for key in ("hashMethod", "hashSeed", "tmpFileSuffix", "isStarted"):
        assert info["body"][key] == native_info["body"][key], key
    # the cell's file is named as JupyterLab computes it, under the prefix debugInfo announces
    assert ours["cell file"] and native["cell file"]
    assert ours["cell name"] == native["cell name"]
    names = [
        [(os.path.basename(item["source"]), item["breakpoints"])]
        for item in (ours["breakpoints"][0], native["breakpoints"][0])
    ]
    assert names[0] == names[1]
    assert shape(ours["initialized"]) == shape(native["initialized"])
    assert ours["exception filters"] is native["exception filters"] is True
    # a stop: the same event, frames, scopes, variables; responses of the same shape
    for key in ("reason", "threadId", "allThreadsStopped"):
        assert ours["stopped"]["body"][key] == native["stopped"]["body"][key], key
    assert set(ours["stopped"]) == set(native["stopped"])
    local = [(name, line, os.path.basename(path)) for name, line, path in ours["frames"]]
    remote = [(name, line, os.path.basename(path)) for name, line, path in native["frames"]]
    assert local == remote == [("f", 2, ours["cell name"]), ("<module>", 5, ours["cell name"])]
    for key in ("stackTrace", "scopes", "variables", "next", "continue", "disconnect"):
        assert shape(ours[key]) == shape(native[key]), key
    assert [s["name"] for s in ours["scopes"]["body"]["scopes"]] == ["Locals", "Globals"]
    assert ours["locals"] == native["locals"] == [("a", "5", "int")]
    assert ours["evaluate"] == native["evaluate"] == "50"
    # next: continued, then stopped at the next line
    assert ours["continued"]["body"] == native["continued"]["body"]
    assert ours["stepped"]["body"]["reason"] == native["stepped"]["body"]["reason"] == "step"
    assert ours["stepped line"] == native["stepped line"] == 3
    assert ours["cell status"] == native["cell status"] == "ok"
    assert ours["steps"] == native["steps"] == [("next", [("<module>", 6)])]
    # the variables pane while idle
    assert shape(ours["inspectVariables"]["body"]["variables"][0]) == shape(
        native["inspectVariables"]["body"]["variables"][0]
    )
    assert ours["names"] == native["names"] == {"x": "5", "y": "6", "z": "12"}
    assert ours["rich"] == native["rich"] == {"data": {"text/plain": "12"}, "metadata": {}}
    assert ours["after"] is native["after"] is False


def test_a_stopped_cell_waits_past_its_time_limit_and_ends_on_interrupt(start_kernel) -> None:
    """Stopped, the cell waits for the person: its time limit does not run; an interrupt
    ends it with KeyboardInterrupt, the session and the kernel's state live on."""
    # the interrupt's grace, for a loaded machine: the traceback is written within it
    kernel = start_kernel(["--WasmKernel.time_limit=2", "--WasmKernel.interrupt_grace=30"])
    panel = Panel(kernel)
    panel.start(CELL, BREAKPOINT)
    msg_id = panel.client.execute(CELL)
    panel.event("stopped")
    time.sleep(3)  # longer than the cell's time limit, stopped
    assert panel.top_frame()["line"] == BREAKPOINT
    # the debugger's console runs a statement in the frame; a local copied to the globals
    panel.request("evaluate", expression="a = 40", frameId=1, context="repl")
    panel.request("copyToGlobals", srcVariableName="a", dstVariableName="g", srcFrameId=1)
    # out of f: back on the line that called it, as debugpy stops (debugpy then hangs on a
    # later disconnect, so this is not in the side-by-side test)
    assert panel.steps(["stepOut"]) == [("stepOut", [("<module>", 5)])]
    panel.request("continue", threadId=1)
    assert panel.reply(msg_id)["status"] == "ok"
    assert kernel.execute("print(g, y)").stream_text() == "40 41\n"
    kernel.execute("x = 6")
    msg_id = panel.client.execute(CELL)
    panel.event("stopped")
    kernel.manager.interrupt_kernel()
    panel.event("continued")
    reply = panel.reply(msg_id)
    assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
    assert panel.request("debugInfo")["body"]["breakpoints"]  # the host's session stands
    assert panel.request("stackTrace", threadId=1)["success"] is False  # nothing stopped
    assert kernel.execute("print(x)").stream_text() == "5\n", reply


def test_pause_stops_a_running_cell_where_it_is(start_kernel) -> None:
    """The pause button stops a running cell (here a loop that never ends) at its next line;
    the panel reads its variables there; continue lets it run on, an interrupt ends it."""
    kernel = start_kernel(["--WasmKernel.interrupt_grace=30"])  # for a loaded machine
    panel = Panel(kernel)
    panel.start(CELL, BREAKPOINT)
    assert panel.request("pause", threadId=1)["success"] is False  # nothing runs
    msg_id = panel.client.execute("n = 0\nwhile n >= 0:\n    n += 1\n")
    time.sleep(0.5)
    assert panel.request("pause", threadId=1)["success"]
    assert panel.event("stopped")["body"]["reason"] == "pause"
    frame = panel.top_frame()
    assert (frame["name"], frame["line"] in (2, 3)) == ("<module>", True)
    assert panel.request("evaluate", expression="n > 0", frameId=frame["id"])["body"] == {
        "result": "True",
        "type": "bool",
        "variablesReference": 0,
        "presentationHint": {},
    }
    panel.request("continue", threadId=1)
    panel.event("continued")
    kernel.manager.interrupt_kernel()
    reply = panel.reply(msg_id)
    assert (reply["status"], reply["ename"]) == ("error", "KeyboardInterrupt")
    run = kernel.execute("print(n > 0)")
    assert run.stream_text() == "True\n", (reply, run.content)


def test_a_trap_after_a_step_rolls_back_and_the_session_goes_on(start_kernel) -> None:
    """A cell that runs out of fuel after the person stepped is rolled back like any trap;
    the session's breakpoints are the host's, so the next run stops again."""
    kernel = start_kernel(["--WasmKernel.fuel=1000000000"])
    spin = "kept = 1\nkept = 2\nwhile True:\n    pass\n"
    panel = Panel(kernel)
    panel.start(spin, 1)
    msg_id = panel.client.execute(spin)
    panel.event("stopped")
    panel.request("next", threadId=1)
    panel.event("stopped")
    assert panel.top_frame()["line"] == 2
    panel.request("continue", threadId=1)
    assert panel.reply(msg_id)["ename"] == "FuelExhausted"
    assert kernel.execute("print('kept' in dir())").stream_text() == "False\n"  # rolled back
    msg_id = panel.client.execute(spin)
    assert panel.event("stopped")["body"]["reason"] == "breakpoint"
    assert panel.top_frame()["line"] == 1
    kernel.manager.interrupt_kernel()
    assert panel.reply(msg_id)["ename"] == "KeyboardInterrupt"


def test_the_idle_variables_pane_expands_and_module_sources_are_read(kernel: Kernel) -> None:
    """While no cell runs, the variables pane's containers expand (paged), and the source of
    a file a frame may be in (a module of the user's) is read in the sandbox."""
    module = "def helper():\n    return 3\n"
    code = f"d = {{'k': [1, 2]}}\nopen('/tmp/helper_module.py', 'w').write({module!r})"
    assert kernel.execute(code).content["status"] == "ok"
    panel = Panel(kernel)
    shown = panel.request("inspectVariables")["body"]["variables"]
    d = next(v for v in shown if v["name"] == "d")
    inside = panel.request("variables", variablesReference=d["variablesReference"])["body"]
    (k,) = inside["variables"]
    assert (k["name"], k["value"], k["type"]) == ("k", "[1, 2]", "list")
    page = panel.request("variables", variablesReference=k["variablesReference"], start=1, count=1)
    assert [(v["name"], v["value"]) for v in page["body"]["variables"]] == [("1", "2")]
    source = panel.request("source", source={"path": "/tmp/helper_module.py"})
    assert source["body"]["content"] == module
    assert panel.request("source", source={"path": "/tmp/absent.py"})["success"] is False


@pytest.mark.parametrize("op", ["debug_stop", "debug_answer"])
def test_a_cell_cannot_stop_itself_without_a_panel(kernel: Kernel, op: str) -> None:
    """A stop waits for a person with the time limit paused: with no debug session (no panel
    to answer), the host lets the cell go on at once."""
    message = {"op": op, "reason": "pause", "success": True}
    code = f"import _host, json\nprint(json.loads(_host.call(json.dumps({message!r}).encode())))"
    assert kernel.execute(code).stream_text() == "{'resume': 'continue', 'breakpoints': {}}\n"


def test_rich_variables_pass_the_active_output_policy(start_kernel) -> None:
    """The variables pane's rich view is output like any other: what would run code in the
    front end is dropped under active_output=block, stopped or not."""
    kernel = start_kernel(["--WasmKernel.active_output=block"])
    code = (
        "class Shown:\n"
        "    def _repr_html_(self):\n"
        "        return '<b>bold</b><script>alert(1)</script>'\n"
        "shown = Shown()\n"
    )
    assert kernel.execute(code).content["status"] == "ok"
    panel = Panel(kernel)
    data = panel.request("richInspectVariables", variableName="shown")["body"]["data"]
    assert "<b>bold</b>" in data["text/html"] and "<script" not in data["text/html"]


def test_turned_off_the_debugger_says_so(start_kernel) -> None:
    """WasmKernel.debugger=False: kernel_info does not offer it; requests get a DAP error."""
    kernel = start_kernel(["--WasmKernel.debugger=False"])
    features = kernel.client.kernel_info(reply=True, timeout=WAIT)["content"]["supported_features"]
    assert "debugger" not in features
    panel = Panel(kernel)
    for content in (
        {"type": "request", "seq": 1, "command": "initialize", "arguments": {}},
        {"seq": "not a number", "command": ["not", "text"]},
    ):
        panel.client.control_channel.send(panel.client.session.msg("debug_request", content))
        reply = panel.client.get_control_msg(timeout=WAIT)
        assert reply["msg_type"] == "debug_reply"
        assert reply["content"]["success"] is False
        assert "WasmKernel.debugger" in reply["content"]["message"]
        assert reply["content"]["request_seq"] == (1 if content["seq"] == 1 else 0)
    assert kernel.execute("print(6 * 7)").stream_text() == "42\n"


@pytest.mark.parametrize("origin", ["strict profile", "snapshot restore", "resume_from"])
def test_the_panel_where_sessions_come_from(start_kernel, tmp_path, origin: str) -> None:
    """The panel stops, reads variables and steps in a strict kernel, in a session brought
    back by ``%snapshot restore`` (the breakpoints, set before the restore, are the host's and
    stand), and in a session resumed in another kernel process."""
    env = {"WASM_KERNEL_SNAPSHOT_DIR": str(tmp_path)}
    if origin == "strict profile":
        kernel = start_kernel(kernel_name="wasm-python-strict")
        panel = Panel(kernel)
        panel.start(CELL, BREAKPOINT)
        kernel.execute("w = 'kept'")
    else:
        saved = start_kernel(env=env)
        saved.execute("w = 'kept'")
        assert saved.execute("%snapshot save before").content["status"] == "ok"
        if origin == "snapshot restore":
            kernel = saved
            panel = Panel(kernel)
            panel.start(CELL, BREAKPOINT)
            kernel.execute("w = 'changed'")
            assert kernel.execute("%snapshot restore before").content["status"] == "ok"
        else:
            kernel = start_kernel(["--WasmKernel.resume_from=before"], env=env)
            panel = Panel(kernel)
            panel.start(CELL, BREAKPOINT)
    msg_id = panel.client.execute(CELL)
    assert panel.event("stopped")["body"]["reason"] == "breakpoint"
    frame = panel.top_frame()
    assert (frame["name"], frame["line"]) == ("f", BREAKPOINT)
    local = panel.request("scopes", frameId=frame["id"])["body"]["scopes"][0]
    shown = panel.request("variables", variablesReference=local["variablesReference"])
    assert [(v["name"], v["value"]) for v in shown["body"]["variables"]] == [("a", "5")]
    assert panel.steps(["next"]) == [("next", [("f", 3), ("<module>", 5)])]
    panel.request("continue", threadId=1)
    assert panel.reply(msg_id)["status"] == "ok"
    assert kernel.execute("print(w, z)").stream_text() == "kept 12\n"


@pytest.mark.parametrize("length", [*range(12), 999, 1000, 1001, 1002, 4099])
def test_cell_file_hash_is_ipykernels(length: int) -> None:
    """Cells are named by ipykernel's murmur2 of their text (so JupyterLab's breakpoints land),
    for every length of tail and for text beyond ASCII."""
    text = ("x = 'é🐍' + str(len(_))\n" * (length // 20 + 1))[:length]
    assert get_tmp_hash_seed() == cell_files.HASH_SEED
    assert cell_files.murmur2(text.encode()) == murmur2_x86(text, cell_files.HASH_SEED)
