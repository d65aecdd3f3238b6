"""Shared by the rekindle package's tests (python/tests/test_*.py): puts python/ first on
sys.path (the package under test, not an installed one), finds rk (RK, as tests/it_*.sh set it,
else build/rk in the source tree) and makes temporary directories."""

import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)
SRC = os.path.dirname(PYDIR)
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)


def rk():
    """The rk executable, or None."""
    for cand in (os.environ.get("RK"), os.path.join(os.environ.get("RK_BUILD", ""), "rk"),
                 os.path.join(SRC, "build", "rk")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def librekindle():
    """librekindle.so of the build tree, or None."""
    for d in (os.environ.get("RK_BUILD"), os.path.dirname(rk() or ""), os.path.join(SRC, "build")):
        if d:
            p = os.path.join(d, "librekindle.so")
            if os.path.isfile(p):
                return p
    return None


def tmpdir(test):
    """A fresh directory removed when `test` ends (under RK_TMP when set)."""
    base = os.environ.get("RK_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    d = tempfile.mkdtemp(prefix="rkpy.", dir=base)
    test.addCleanup(shutil.rmtree, d, True)
    return d


def env_with_pythonpath(extra=None):
    """os.environ with python/ first on PYTHONPATH, plus `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = PYDIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


def need_rk(test):
    if rk() is None:
        raise unittest.SkipTest("rk not built (set RK, or build into build/)")
    return rk()
