"""``captum_cw`` exports every public class of its public modules.

The rule: a class is public when its module lists it in ``__all__``; a module is public unless it is a
subpackage (which exports its own classes) or is named in INTERNAL below, with the reason its classes stay
out of the top-level namespace. So a new module's public classes are exported unless someone says why not."""

import importlib
import inspect
import pkgutil

import captum_cw

INTERNAL = {
    "captum_cw.arguments": "the command line's parser",
    "captum_cw.cli": "the command line",
    "captum_cw.capture": "the forward-pass hooks the attributors install",
    "captum_cw.geometry": "what the hooks capture, for the metrics' functions",
    "captum_cw.scan": "the attributors' forward pass",
    "captum_cw.scoring": "the attributors' scoring core (MetricAttribution.score returns its Scores)",
    "captum_cw.self_check": "the attributors' self-check",
    "captum_cw.target_contributions": "TokenContributions' target scores",
    "captum_cw.models": "the loader of the bundled offline models",
    "captum_cw.statistics": "the evaluation's confidence intervals and paired tests",
    "captum_cw.inseq_method": "an inseq plugin: it imports inseq, an optional package",
}


def _public_modules() -> list[str]:
    modules = [f"captum_cw.{info.name}" for info in pkgutil.iter_modules(captum_cw.__path__)
               if not info.ispkg and not info.name.startswith("_")]
    assert set(INTERNAL) <= set(modules), "INTERNAL names a module that does not exist"
    return [module for module in modules if module not in INTERNAL]


def test_every_public_class_is_exported():
    missing = []
    for name in _public_modules():
        module = importlib.import_module(name)
        for attribute in module.__all__:
            value = getattr(module, attribute)
            if inspect.isclass(value) and (attribute not in captum_cw.__all__
                                           or getattr(captum_cw, attribute, None) is not value):
                missing.append(f"{name}.{attribute}")
    assert missing == [], f"add to captum_cw/__init__.py (import and __all__): {missing}"


def test_every_export_exists():
    assert len(set(captum_cw.__all__)) == len(captum_cw.__all__)
    assert [name for name in captum_cw.__all__ if not hasattr(captum_cw, name)] == []
