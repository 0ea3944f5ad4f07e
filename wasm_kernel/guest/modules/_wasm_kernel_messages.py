"""The messages the guest sends the host through ``_host.call``, declared once for both sides.

The guest loads this file as a module of its own; the host imports it as
``wasm_kernel.guest.modules._wasm_kernel_messages`` and validates every message against it
(``wasm_kernel.protocol``). Each message is a JSON object whose ``op`` is one of these names.
"""

RESULT = "result"  # a cell's value: execute_result (data, metadata)
DISPLAY = "display"  # display_data, or update_display_data when update is true
CLEAR = "clear"  # clear_output (wait)
ERROR = "error"  # the cell's error (ename, evalue, traceback lines)
PAYLOAD = "payload"  # execute_reply payloads: '?' pages, set_next_input, ask_exit
INPUT = "input"  # input_request (prompt, password); the reply holds value or error
SLEEP = "sleep"  # time.sleep that an interrupt cuts short (seconds)
REPLY = "reply"  # the answer of a service request (content)
DESCRIBE = "describe"  # %sandbox: the kernel's description of the sandbox
PIP = "pip"  # %pip: a command and package names for the host's pip (command, args, upgrade)
SNAPSHOT = "snapshot"  # %snapshot: save, restore, list or delete an image (action, name)
INTERRUPTION = "interruption"  # why the cell is interrupted; the reply holds time_limit or not
IMMORTALIZE = "immortalize"  # boot image only: objects to make immortal (addresses, base64 u32)

#: sources of execute_reply payloads, as ipykernel's shell writes them
PAYLOAD_SOURCES = ("page", "set_next_input", "ask_exit")

#: what ``input`` replies carry in ``error`` when there is no value
NO_STDIN, EOF, INTERRUPTED = "no-stdin", "eof", "interrupted"
