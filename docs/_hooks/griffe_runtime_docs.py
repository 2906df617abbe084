"""A Griffe extension of the documentation site (mkdocs.yml: mkdocstrings ``extensions``).

mkdocstrings reads docstrings from the source without importing it. A class whose decorator
completes its docstring at import time (``dualdrop.linear.glm``'s ``_with_init_doc`` appends the
constructor note the GLM estimators share) would show only the part written in the class body.
For a decorated class this extension imports the object and takes its runtime docstring when
that one extends the static one; nothing else is imported.
"""

from __future__ import annotations

import importlib
import inspect

import griffe

# decorators that never touch a docstring: no import for them
_PLAIN = {"dataclass", "dataclasses.dataclass", "property", "staticmethod", "classmethod",
          "functools.total_ordering", "total_ordering"}


def _runtime_doc(path: str) -> str | None:
    module, _, name = path.rpartition(".")
    while module:
        try:
            obj = importlib.import_module(module)
            break
        except ImportError:
            module, _, outer = module.rpartition(".")
            name = f"{outer}.{name}"
    else:
        return None
    for part in name.split("."):
        obj = getattr(obj, part, None)
    return inspect.getdoc(obj) if obj is not None else None


class RuntimeDocstrings(griffe.Extension):
    """Decorated classes get the docstring their decorators built."""

    def on_class_instance(self, *, cls: griffe.Class, **kwargs) -> None:
        names = {str(d.value).split("(")[0] for d in cls.decorators}
        if not names - _PLAIN:
            return
        doc = _runtime_doc(cls.path)
        static = cls.docstring.value if cls.docstring else ""
        if doc and doc != static and doc.startswith(static):
            if cls.docstring:
                cls.docstring.value = doc
            else:
                cls.docstring = griffe.Docstring(doc, parent=cls)
