"""Every docstring example in the package runs, on the bundled SmolLM2-135M, and prints what it shows."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest
import torch

import captum_cw
from conftest import missing_reason

MODULES = sorted(info.name for info in pkgutil.walk_packages(captum_cw.__path__, "captum_cw.")
                 if info.name != "captum_cw.__main__")
OPTIONAL = {"captum_cw.inseq_method": "inseq"}  # modules that import an optional package, and the package


def _examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    for name in MODULES:
        package = OPTIONAL.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            yield pytest.param(None, id=name, marks=pytest.mark.skip(reason=missing_reason(package)))
            continue
        module = importlib.import_module(name)
        for test in finder.find(module, name):
            if test.examples:
                yield pytest.param(test, id=test.name)


@pytest.mark.parametrize("example", list(_examples()))
def test_docstring_example(example, smollm2):
    model, tokenizer = smollm2
    tokenizer.padding_side = "left"
    example.globs.update({"model": model, "tokenizer": tokenizer, "torch": torch, "n": 5})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    output = []
    runner.run(example, out=output.append)
    assert runner.failures == 0, "".join(output)
