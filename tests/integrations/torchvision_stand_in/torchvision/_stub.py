"""The tests' stand-in for torchvision: every name is a class that refuses to be used.

timm imports torchvision when it is imported; on the project's CPU machines no torchvision build
matching the pinned CPU torch imports, so tests/integrations/test_timm.py puts this package on
``sys.path`` there. timm's Vision Transformers use none of its names; anything that does raises
``ImportError`` naming it. Never installed, never imported by osa_lab itself."""


class _Meta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(f"{cls.__qualname__}.{name}")

    def __call__(cls, *a, **k):
        raise ImportError(f"stub torchvision: {cls.__qualname__} is not available")


def _make(qualname):
    return _Meta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


def module_getattr(modname):
    def __getattr__(name):  # noqa: N807  (a module-level __getattr__, PEP 562)
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(f"{modname}.{name}")

    return __getattr__
