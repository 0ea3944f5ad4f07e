"""The backend module matplotlib loads for inline figures (``module://`` + this name).

It is separate from ``backend_inline`` because matplotlib reserves that module's name for the
real matplotlib-inline distribution, which is not installed in the sandbox.
"""

from matplotlib.backend_bases import _Backend
from matplotlib.backends.backend_agg import FigureCanvasAgg

from matplotlib_inline import backend_inline

NAME = "module://matplotlib_inline.sandbox_backend"


@_Backend.export
class _BackendInline(_Backend):
    FigureCanvas = FigureCanvasAgg
    FigureManager = backend_inline.FigureManagerInline

    @staticmethod
    def show(block=None):
        backend_inline.show(block=block)
