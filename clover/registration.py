"""Register `clover_moe` with transformers' Auto classes on first use.

`import clover` must stay light (the CLI answers `--help` without torch), yet the documented pattern
`import clover; AutoModelForCausalLM.from_pretrained(DIR)` must work. So importing clover only
installs a small import hook: once transformers' auto modules exist, their loading entry points
(`AutoConfig.from_pretrained`/`for_model`, `AutoModelForCausalLM.from_pretrained`/`from_config`)
register the Clover classes before their first call. Registration is deferred to that call, not done
inside the import, so it never runs while transformers is half-imported.
"""

import functools
import importlib.abc
import sys

# module -> (Auto class, its class methods that may need clover_moe)
ENTRY_POINTS = {
    "transformers.models.auto.configuration_auto": ("AutoConfig", ("from_pretrained", "for_model")),
    "transformers.models.auto.modeling_auto": ("AutoModelForCausalLM", ("from_pretrained", "from_config")),
}

_registered = False


def register_auto_classes() -> None:
    """Register CloverMoeConfig / CloverMoeForCausalLM with AutoConfig / AutoModelForCausalLM (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    from .model import CloverMoeConfig, CloverMoeForCausalLM

    AutoConfig.register("clover_moe", CloverMoeConfig, exist_ok=True)
    AutoModelForCausalLM.register(CloverMoeConfig, CloverMoeForCausalLM, exist_ok=True)
    _registered = True


def _register_first(auto_class: type, method: str) -> None:
    """Replace `auto_class.method` (a classmethod) with one that registers Clover, then delegates."""
    func = getattr(auto_class, method).__func__

    @functools.wraps(func)
    def first_use(cls, *args, **kwargs):
        register_auto_classes()
        return func(cls, *args, **kwargs)

    setattr(auto_class, method, classmethod(first_use))


def _install(module) -> None:
    class_name, methods = ENTRY_POINTS[module.__name__]
    auto_class = getattr(module, class_name)
    for method in methods:
        _register_first(auto_class, method)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds the watched modules through the other finders and installs the hooks once they ran."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in ENTRY_POINTS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_install(module):
            exec_module(module)
            _install(module)

        spec.loader.exec_module = exec_then_install
        return spec


def install() -> None:
    """Hook the Auto classes already imported now, and the rest when they are imported."""
    pending = False
    for name in ENTRY_POINTS:
        module = sys.modules.get(name)
        if module is not None and hasattr(module, ENTRY_POINTS[name][0]):
            _install(module)
        else:
            pending = True
    if pending and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())
