"""LazyRegistry: classes by name, the built-in ones imported only when first asked for.

The reasoning and tool-call parser managers are registries of this kind (vLLM's
`ReasoningParserManager` and `ToolParserManager`): each subclass names what it holds and the
base class its entries must derive from, and gets registries of its own.
"""

import importlib
from typing import ClassVar


class LazyRegistry:
    kind: ClassVar[str] = "entry"
    """What an entry is, for error messages (e.g. "Reasoning parser")."""
    base: ClassVar[type] = object
    """Every registered class derives from it."""
    classes: ClassVar[dict[str, type]]
    lazy: ClassVar[dict[str, tuple[str, str]]]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.classes, cls.lazy = {}, {}

    @classmethod
    def get(cls, name: str) -> type:
        """The class of `name`; a KeyError naming the registered ones otherwise."""
        if name not in cls.classes:
            if name not in cls.lazy:
                registered = ", ".join(cls.list_registered())
                raise KeyError(f"{cls.kind} {name!r} not found. Available parsers: {registered}")
            module_path, class_name = cls.lazy[name]
            cls.classes[name] = getattr(importlib.import_module(module_path), class_name)
        return cls.classes[name]

    @classmethod
    def list_registered(cls) -> list[str]:
        return sorted(set(cls.classes) | set(cls.lazy))

    @classmethod
    def register_lazy_module(cls, name: str, module_path: str, class_name: str) -> None:
        cls.lazy[name] = (module_path, class_name)

    @classmethod
    def register_module(cls, name: str | list[str], module: type) -> type:
        if not (isinstance(module, type) and issubclass(module, cls.base)):
            raise TypeError(f"module must be a subclass of {cls.base.__name__}, got {module!r}.")
        for each in [name] if isinstance(name, str) else name:
            cls.classes[each] = module
        return module
