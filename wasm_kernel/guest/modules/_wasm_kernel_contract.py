"""The contract between the guest and the host, declared once for both sides.

The guest loads this file as a module of its own (``_wasm_kernel_contract``); the host imports
it as ``wasm_kernel.guest.modules._wasm_kernel_contract`` and derives its validator from these
declarations (``wasm_kernel.sandbox.contract``). It declares:

- every message the guest sends through ``_host.call``: a JSON object whose ``op`` names a
  ``Message``, each field with its kind and bound, and the fields of the host's reply;
- every entry point the host calls in the guest (``EntryPoint``), and the services
  ``serve`` runs;
- the codes and reasons both sides write (input failures, the turn's exit statuses).

Stdout and stderr are not messages: they stay ordinary file writes that the host streams.
Declarations are tuples, so a cell cannot change them in place; the guest's kernel module
checks after every cell that its names still hold the same objects.
"""

from collections import namedtuple

# -- what a field holds ---------------------------------------------------------------------
TEXT = "text"  # a string of at most ``limit`` characters
CLIPPED = "clipped"  # a string, cut to ``limit`` characters
LINES = "lines"  # a list of strings, cut to ``limit`` characters all told
FLAG = "flag"  # true or false
INTEGER = "integer"  # a whole number
SECONDS = "seconds"  # a finite, non-negative number, read as a float
OBJECT = "object"  # a JSON object with string keys (``keys``: the kinds of known keys)
BUNDLE = "bundle"  # a mime bundle: mime type -> text or JSON (``empty``: may hold nothing)
CHOICE = "choice"  # one of ``choices``
WORDS = "words"  # a list of at most ``limit`` strings, each at most WORD_LIMIT characters
ADDRESSES = "addresses"  # base64 of little-endian 32-bit guest addresses, read as bytes
ITEMS = "items"  # a list of at most ``limit`` objects, each one of the ``shapes`` by its tag
JSON = "json"  # any JSON value (the host's replies: a tool's result)
HEADERS = "headers"  # a list of at most ``limit`` [name, value] string pairs (HTTP headers)
BYTES = "bytes"  # base64 of at most ``limit`` bytes, read as bytes
BUFFERS = "buffers"  # a list of at most ``limit`` base64 strings, read as bytes

REQUIRED = ...  # a field without a default must be present
MESSAGE_LIMIT = 64 << 20  # bytes of any one message from the guest, as sent
WORD_LIMIT = 1000
HEADER_LIMIT = 64 * 1024  # characters of one header's name or value
ERROR_TEXT_LIMIT = 256 * 1024  # characters of an error's value, traceback or prompt

GUEST_MODULE = "_wasm_kernel"  # the kernel's module inside the guest
KERNEL_FILES = "<wasm-kernel"  # how the file names of the kernel's guest code start
GUEST_FILE = KERNEL_FILES + ">"  # the kernel module's; shipped modules' add ":NAME>"
# tracebacks leave out frames of the kernel's guest code
# The folder beside the stdlib zip where a zip of the same name holds the sources of the
# modules it ships as bytecode only: the guest reads them for tracebacks and ``??``
SOURCES_FOLDER = "sources"

# exit statuses of a turn, besides the cell's own (0 ok, 1 an uncaught exception)
TURN_REFUSED = -1  # the interpreter refuses turns: an earlier one trapped
DAMAGED = 86  # the cell broke the kernel's code in the guest: roll it back


class Field(namedtuple("Field", "name kind limit default choices keys shapes empty")):
    """One field of a message: what it holds, its bound, its default when absent.
    ``choices``: for CHOICE; ``keys``: for OBJECT, the kinds of its known keys; ``shapes``:
    for ITEMS, the shapes an item may take; ``empty``: a BUNDLE that may hold nothing."""

    __slots__ = ()

    def __new__(
        cls,
        name,
        kind,
        limit=None,
        default=REQUIRED,
        *,
        choices=(),
        keys=(),
        shapes=(),
        empty=False,
    ):
        keys = keys or {}
        return super().__new__(cls, name, kind, limit, default, choices, keys, shapes, empty)


class Shape(namedtuple("Shape", "tag fields rules")):
    """An object named by its ``source`` (``tag``), with its fields; ``rules``: checks across
    fields, each (what it requires, a test of the checked object)."""

    __slots__ = ()
    tag_key = "source"

    def __new__(cls, tag, *fields, rules=()):
        return super().__new__(cls, tag, fields, rules)


class Message(namedtuple("Message", "op fields rules reply output droppable waits limit")):
    """A message from the guest, named by its ``op``. ``reply``: the fields the host's answer
    may hold. ``output``: it reaches the client, so it counts against the cell's output
    budget; ``droppable``: past that budget it is left out (an error is not: it still fails
    the cell). ``waits``: the host waits for a person, or does work of its own (pip), while
    the guest waits, so the cell's time limit is paused. ``limit``: bytes of the message as
    sent (its JSON text), at most MESSAGE_LIMIT; the host reads none larger (see
    ``too_large``)."""

    __slots__ = ()
    tag_key = "op"

    def __new__(
        cls,
        op,
        *fields,
        rules=(),
        reply=(),
        output=False,
        droppable=False,
        waits=False,
        limit=None,
    ):
        limit = MESSAGE_LIMIT if limit is None else limit
        return super().__new__(cls, op, fields, rules, reply, output, droppable, waits, limit)

    @property
    def tag(self):
        return self.op


class EntryPoint(namedtuple("EntryPoint", "name parameters defaults")):
    """A function of the guest's kernel module that the host calls, with its parameters and
    the defaults of its last ones (the function's own), which a call leaves out where it can:
    every argument sent is decoded in the guest at every turn."""

    __slots__ = ()

    def __new__(cls, name, *parameters, **defaults):
        return super().__new__(cls, name, parameters, defaults)


# -- replies' codes ---------------------------------------------------------------------------
NO_STDIN, EOF, INTERRUPTED = "no-stdin", "eof", "interrupted"  # why ``input`` got no value
PIP_COMMANDS = ("install", "uninstall", "list", "show")
# why an ``http`` request got no response: the host refused it (not listed, a non-public
# address, over the cell's budget), it failed (DNS, connection, TLS, bad HTTP), it took longer
# than the guest's own timeout, or the cell was interrupted (INTERRUPTED)
HTTP_REFUSED, HTTP_FAILED, HTTP_TIMEOUT = "refused", "failed", "timeout"

# -- messages from the guest --------------------------------------------------------------------
_DISPLAY_ID_FOR_UPDATE = (
    "an update needs a display_id",
    lambda message: not message["update"] or "display_id" in message["transient"],
)


def _shown(op, empty, *more):
    """A result or a display: a mime bundle with its metadata, perhaps a display_id."""
    return Message(
        op,
        Field("data", BUNDLE, empty=empty),
        Field("metadata", OBJECT, default={}),
        Field("transient", OBJECT, default={}, keys={"display_id": TEXT}),
        Field("update", FLAG, default=False),
        *more,
        rules=(_DISPLAY_ID_FOR_UPDATE,),
        output=True,
        droppable=True,
    )


# a cell's value: execute_result. ``last``: it comes from the cell's last statement, after which
# only the cell's post-run hooks run, so the kernel may send it with the turn's next message
RESULT = _shown("result", False, Field("last", FLAG, default=False))
# display_data, or update_display_data when update is true; ipykernel sends
# display(display_id=...) with no data at all
DISPLAY = _shown("display", empty=True)
CLEAR = Message(
    "clear", Field("wait", FLAG, default=False), output=True, droppable=True
)  # clear_output
ERROR = Message(  # the cell's error
    "error",
    Field("ename", TEXT, limit=1023),
    Field("evalue", CLIPPED, limit=ERROR_TEXT_LIMIT),
    Field("traceback", LINES, limit=ERROR_TEXT_LIMIT),
    Field("publish", FLAG, default=True),  # False: IPython printed it already (a UsageError)
    output=True,
)
PAGE = Shape("page", Field("data", BUNDLE), Field("start", INTEGER, default=0))
SET_NEXT_INPUT = Shape(
    "set_next_input", Field("text", TEXT, limit=None), Field("replace", FLAG, default=False)
)
ASK_EXIT = Shape("ask_exit", Field("keepkernel", FLAG, default=False))
PAYLOAD = Message(  # execute_reply payloads, as ipykernel's shell writes them
    "payload",
    Field("payload", ITEMS, limit=16, shapes=(PAGE, SET_NEXT_INPUT, ASK_EXIT)),
    output=True,
    droppable=True,
)
INPUT = Message(  # input_request on the stdin channel
    "input",
    Field("prompt", TEXT, limit=ERROR_TEXT_LIMIT, default=""),
    Field("password", FLAG, default=False),
    reply=(Field("value", TEXT), Field("error", CHOICE, choices=(NO_STDIN, EOF, INTERRUPTED))),
    waits=True,
)
SLEEP = Message(  # time.sleep, which an interrupt cuts short
    "sleep",
    Field("seconds", SECONDS),
    reply=(Field("interrupted", FLAG),),
)
REPLY = Message("reply", Field("content", OBJECT))  # a service's answer (see SERVICES)
DESCRIBE = Message("describe", reply=(Field("text", TEXT),))  # %sandbox
PIP = Message(  # %pip: names for the host's pip, which checks each again
    "pip",
    Field("command", CHOICE, choices=PIP_COMMANDS),
    Field("args", WORDS, limit=1000),
    Field("upgrade", FLAG),
    reply=(Field("text", TEXT), Field("error", TEXT)),
    waits=True,
)
SNAPSHOT = Message(  # %snapshot: save, restore, list or delete an image
    "snapshot",
    Field("action", TEXT, limit=64),
    Field("name", TEXT, limit=1024, default=""),
    reply=(Field("text", TEXT), Field("error", TEXT)),
)
INTERRUPTION = Message(  # why the cell is interrupted: its time limit, or not; or the visual
    "interruption",  # debugger's pause, which stops the cell at its next line instead
    reply=(Field("time_limit", TEXT), Field("pause", FLAG)),
)
TOOLS = Message(  # sandbox_tools: the running cell's tools, unless the guest has them (digest)
    "tools",
    Field("digest", TEXT, limit=64, default=""),
    reply=(Field("digest", TEXT), Field("tools", OBJECT)),  # name -> declaration
)
TOOL = Message(  # a call of one of them, its arguments by parameter name (see sandbox_tools);
    # the wait costs no fuel and counts against the cell's time limit (so not ``waits``)
    "tool",
    Field("name", TEXT, limit=256),
    Field("arguments", OBJECT),
    reply=(Field("value", JSON), Field("error", OBJECT), Field("interrupted", FLAG)),
    limit=64 << 20,  # the call with its arguments, as JSON (bytes as base64)
)
TOOL_RESULT_LIMIT = 16 << 20  # bytes of a tool's value as JSON, in the reply to a TOOL message
HTTP = Message(  # a request the host makes for the cell, if WasmKernel.network_allow lets it
    "http",
    Field("method", TEXT, limit=32),
    Field("url", TEXT, limit=8192),
    Field("headers", HEADERS, limit=256, default=()),
    Field("body", BYTES, limit=32 << 20, default=b""),
    Field("timeout", SECONDS, default=0.0),  # the guest's own, for the whole request; 0: none
    reply=(
        Field("status", INTEGER),
        Field("reason", TEXT),
        Field("headers", HEADERS),
        Field("body", BYTES),  # as sent: never decompressed, no transfer coding
        Field("url", TEXT),
        Field("error", CHOICE, choices=(HTTP_REFUSED, HTTP_FAILED, HTTP_TIMEOUT, INTERRUPTED)),
        Field("detail", TEXT),  # with error: why, for the exception
    ),
)
# comms (see the guest's _wasm_kernel_comms): what a comm in the guest sends the front end
COMM_MESSAGE_TYPES = ("comm_open", "comm_msg", "comm_close")
COMM_BUFFERS = 64  # binary buffers one comm message may carry
COMM_ID_LIMIT = 256  # characters of a comm_id, both ways
COMM = Message(  # comm_open, comm_msg or comm_close on IOPub; the reply's error: not sent
    "comm",
    Field("msg_type", CHOICE, choices=COMM_MESSAGE_TYPES),
    Field("content", OBJECT, keys={"comm_id": TEXT, "target_name": TEXT}),
    Field("metadata", OBJECT, default={}),
    Field("buffers", BUFFERS, limit=COMM_BUFFERS, default=[]),
    rules=(
        (
            f"a comm message needs a comm_id of at most {COMM_ID_LIMIT} characters",
            lambda message: 0 < len(message["content"].get("comm_id") or "") <= COMM_ID_LIMIT,
        ),
    ),
    reply=(Field("error", TEXT),),
    output=True,
    limit=64 << 20,  # content, metadata and buffers (as base64) together
)
PARENT = Message(  # the request the turn answers (ipywidgets' Output widget captures by it)
    "parent", reply=(Field("header", OBJECT),)
)
# JupyterLab's visual debugger (see the guest's _wasm_kernel_visual_debugger): a cell stopped
# at a breakpoint or a step waits for the person at the debugger panel (``waits``); each reply
# is the next thing to do, a Debug Adapter Protocol request to answer (``request``: command and
# arguments) or how to go on (``resume``), with the session's breakpoints ({file: [lines]})
DEBUG_RESUMES = ("continue", "next", "stepIn", "stepOut", INTERRUPTED)
DEBUG_REPLY = (
    Field("request", OBJECT),
    Field("resume", CHOICE, choices=DEBUG_RESUMES),
    Field("breakpoints", OBJECT),
)
DEBUG_STOP = Message(  # stopped: a debug_event on IOPub
    "debug_stop",
    Field("reason", CHOICE, choices=("breakpoint", "step", "pause")),
    reply=DEBUG_REPLY,
    waits=True,
)
DEBUG_ANSWER_LIMIT = 4 << 20  # bytes of one answer (variables are paged, values clipped)
DEBUG_ANSWER = Message(  # the answer to a request: a DAP response's success, body and message
    "debug_answer",
    Field("success", FLAG),
    Field("body", OBJECT, default={}),
    Field("failure", TEXT, limit=ERROR_TEXT_LIMIT, default=""),  # the response's message
    reply=DEBUG_REPLY,
    waits=True,
    limit=DEBUG_ANSWER_LIMIT,
)
IMMORTALIZE = Message(  # boot image only: objects to make immortal
    "immortalize",
    Field("addresses", ADDRESSES),
    reply=(Field("immortal", INTEGER),),
)

MESSAGES = {
    message.op: message
    for message in (
        RESULT,
        DISPLAY,
        CLEAR,
        ERROR,
        PAYLOAD,
        INPUT,
        SLEEP,
        REPLY,
        DESCRIBE,
        PIP,
        SNAPSHOT,
        INTERRUPTION,
        TOOLS,
        TOOL,
        COMM,
        PARENT,
        IMMORTALIZE,
        HTTP,
        DEBUG_STOP,
        DEBUG_ANSWER,
    )
}

# -- entry points the host calls ----------------------------------------------------------------
# source_hash: the murmur2 that names the cell's file (_wasm_kernel_cell_files.source_hash);
# breakpoints: the visual debugger's, {cell file: [lines]} (empty: no session, no tracing)
RUN_CELL = EntryPoint(
    "run_cell",
    "source",
    "execution_count",
    "source_hash",
    "store_history",
    "silent",
    "breakpoints",
    store_history=True,
    silent=False,
    breakpoints=None,
)
SERVE = EntryPoint("serve", "service", "*arguments")
# after an image is resumed: its open files' offsets ([fd, offset]), and those lost ([fd, path])
SETTLE = EntryPoint("settle", "cwd", "start", "paths", "offsets", "lost")
CLOSE_STALE_FILES = EntryPoint("close_stale_files")
INSTALL_MODULES = EntryPoint("install_modules", "sources")
# a comm_open, comm_msg or comm_close from the front end, as JSON text, buffers in base64
COMM_RECEIVED = EntryPoint("comm_received", "message")
# bytes of one comm message from the front end, its content and metadata as JSON text and its
# buffers together; the kernel refuses a larger one before it reaches the guest (CommRefused)
COMM_RECEIVED_LIMIT = 16 << 20
BOOT = EntryPoint("boot", "packages", "import_paths", "plain_tracebacks")
ALLOW_NETWORK = EntryPoint("allow_network")  # the guest's HTTP libraries use HTTP messages
# after a boot or a resume: the read-only folders whose writes go to a private layer, and
# the guest folder (in /tmp) that holds it; no folders: writes there are refused
LAYER_WRITES = EntryPoint("layer_writes", "folders", "layer")
# the entry points a turn of its own calls (the guest's take_turn): all but those the install
# turn calls, before the kernel module can take turns
TURN_ENTRY_POINTS = tuple(
    entry.name
    for entry in (
        RUN_CELL,
        SERVE,
        SETTLE,
        CLOSE_STALE_FILES,
        COMM_RECEIVED,
        ALLOW_NETWORK,
        LAYER_WRITES,
    )
)

# services ``serve`` runs (the guest's SERVICES table holds exactly these)
COMPLETE = "complete"
INSPECT = "inspect_object"
IS_COMPLETE = "is_complete"
EVALUATE_EXPRESSIONS = "evaluate_expressions"
IMAGE_STATE = "image_state"  # the working folder and open files' offsets, for an image
WARM_UP = "warm_up"  # boot image only
COMM_INFO = "comm_info"  # the open comms, for comm_info_request
DEBUG = "debug"  # a visual debugger's request while no cell runs (inspectVariables ...)
SERVICES = (
    COMPLETE,
    INSPECT,
    IS_COMPLETE,
    EVALUATE_EXPRESSIONS,
    IMAGE_STATE,
    WARM_UP,
    COMM_INFO,
    DEBUG,
)
