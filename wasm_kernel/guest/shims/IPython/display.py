"""IPython.display for wasm-kernel's sandbox: rich output through the kernel's host channel.

The same names as IPython's module: display functions from IPython.core.display_functions,
display objects and display_* helpers from IPython.core.display, and IFrame, FileLink and
Code from IPython.lib.display.
"""

from IPython.core.display import *  # noqa: F403
from IPython.core.display_functions import *  # noqa: F403
from IPython.lib.display import *  # noqa: F403
