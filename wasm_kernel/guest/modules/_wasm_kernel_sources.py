"""Library source for tracebacks and ``??``: the runtime's packages ship as bytecode in the
stdlib zip, and the host keeps the sources they were compiled from in a zip of the same name
in the folder SOURCES_FOLDER beside it (read-only; absent if install could not fetch them).

linecache, and so IPython's tracebacks and ``inspect.getsource``, asks a module's loader for
its source; the stdlib zip's zipimporter has none, so it now asks the sources zip too.
"""

import os
import zipimport

from _wasm_kernel_contract import SOURCES_FOLDER

_zip_source = zipimport.zipimporter.get_source


def _source_beside(importer, fullname):
    """``fullname``'s source from the sources zip beside ``importer``'s archive, or None."""
    folder, name = os.path.split(importer.archive)
    twin = os.path.join(folder, SOURCES_FOLDER, name)
    try:
        return _zip_source(zipimport.zipimporter(os.path.join(twin, importer.prefix)), fullname)
    except (zipimport.ZipImportError, OSError):
        return None


def get_source(self, fullname):
    source = _zip_source(self, fullname)
    return source if source is not None else _source_beside(self, fullname)


def install():
    zipimport.zipimporter.get_source = get_source
