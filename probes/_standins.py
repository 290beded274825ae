"""Import stand-ins for compiled GPU-only packages an old SGLang imports but the probed code never calls.

The registry declares which packages may be stood in for, and why, and which era
uses them; the harness passes them in ``PDEVIDENCE_STAND_INS`` (comma-separated
dotted names, each with its submodules; ``triton-driver`` is a CPU stand-in for triton's active driver,
which triton 3.1-3.3 autotuner decorators ask for at import; ``pyairports`` is an empty airport list, the data
package outlines 0.0.4x reads at import, which PyPI no longer serves). A stand-in module
answers every attribute with a placeholder class, so ``from sgl_kernel import x``,
``class Y(x)`` and decorators work at import; calling anything raises
``StandInCalled`` and is recorded, so a scenario whose path reached a stand-in is
an error, never an observation. Standard library only: it runs inside the cell.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types

ENV = "PDEVIDENCE_STAND_INS"
TRITON_DRIVER = "triton-driver"
PYAIRPORTS = "pyairports"
# Stand-ins that answer with something other than placeholders, each installed by its own function below.
SPECIAL = (TRITON_DRIVER, PYAIRPORTS)

CALLED: list[str] = []  # every stand-in called, in order
TOUCHED: set[str] = set()  # every stand-in name SGLang looked up
INSTALLED: list[str] = []


class StandInCalled(RuntimeError):
    """The probed code reached a package the registry declared it never calls."""


def _placeholder(qualname: str):
    def call(*args, **kwargs):
        CALLED.append(qualname)
        raise StandInCalled(f"the import stand-in {qualname} was called")

    def lookup(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{qualname}.{name}")

    meta = type("StandIn", (type,), {"__call__": lambda cls, *a, **k: call(), "__getattr__": lookup})
    module, _, name = qualname.rpartition(".")
    return meta(name, (), {"__module__": module})


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        TOUCHED.add(f"{self.__name__}.{name}")
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: set[str]):
        self.roots = roots

    def find_spec(self, fullname, path, target=None):
        if any(fullname == root or fullname.startswith(root + ".") for root in self.roots):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+pdevidence-stand-in"
        TOUCHED.add(spec.name)
        return module

    def exec_module(self, module):
        pass


def install(names: list[str] | None = None) -> list[str]:
    """Install the stand-ins named (default: ``$PDEVIDENCE_STAND_INS``) once; return what is installed."""
    if INSTALLED:
        return INSTALLED
    wanted = sorted({n for n in (names if names is not None else os.environ.get(ENV, "").split(",")) if n})
    modules = {n for n in wanted if n not in SPECIAL}
    if modules:
        sys.meta_path.insert(0, _Finder(modules))
    if TRITON_DRIVER in wanted:
        _install_triton_driver()
    if PYAIRPORTS in wanted:
        _install_pyairports()
    INSTALLED.extend(wanted)
    return INSTALLED


def record() -> dict | None:
    """What the result says about stand-ins; None (no key at all) when none was installed."""
    if not INSTALLED:
        return None
    return {"installed": list(INSTALLED), "touched": sorted(TOUCHED), "called": sorted(set(CALLED))}


def _install_triton_driver() -> None:
    import triton.runtime.driver as driver

    class CPUStandInDriver:
        """Answers the questions triton's decorators ask at import; nothing here runs a kernel."""

        @staticmethod
        def is_active():
            return True

        def get_current_target(self):
            from triton.backends.compiler import GPUTarget
            return GPUTarget("cuda", 80, 32)

        def get_benchmarker(self):
            def benchmark(*args, **kwargs):
                CALLED.append("triton.runtime.driver.benchmarker")
                raise StandInCalled("the triton driver stand-in was asked to benchmark a kernel")
            return benchmark

        def get_current_device(self):
            return 0

        def get_current_stream(self, device=None):
            return 0

    holder = driver if hasattr(driver, "set_active") else driver.driver
    holder.set_active(CPUStandInDriver())


class _Airports(types.ModuleType):
    """``pyairports.airports``: its ``AIRPORT_LIST`` is empty (looked up, it is recorded as touched). outlines
    0.0.4x builds an enum of airport codes from it at import; PyPI keeps only an empty pyairports 0.0.1 of a
    package that held the data, and no probed path constrains a request to an airport code."""

    def __getattr__(self, name):
        if name == "AIRPORT_LIST":
            TOUCHED.add(f"{self.__name__}.{name}")
            return []
        raise AttributeError(name)


def _install_pyairports() -> None:
    package = types.ModuleType(PYAIRPORTS)
    package.__path__ = []
    package.__version__ = "0.0.0+pdevidence-stand-in"
    package.airports = _Airports(f"{PYAIRPORTS}.airports")
    sys.modules[PYAIRPORTS] = package
    sys.modules[package.airports.__name__] = package.airports
