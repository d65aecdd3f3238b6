"""`pip install ./python` works: the package is built from a copy of python/ (offline: no build
isolation, no index) into a fresh virtual environment (with the system's site-packages, for
Debian's xxhash) or, without venv, into a --target directory, and imported from there, outside
the source tree. Skipped with a message where pip (python3-pip) or setuptools
(python3-setuptools, python3-wheel) is absent."""

import os
import shutil
import subprocess
import sys
import unittest

import rktest

CHECK = ("import rekindle, rekindle.ckpt, rekindle.inject, rekindle.stacks, rekindle.worker; "
         "print(rekindle.__file__); print(rekindle.__version__)")


class TestPipInstall(unittest.TestCase):
    def setUp(self):
        r = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
        if r.returncode != 0:
            self.skipTest("pip is absent for %s (Debian: apt-get install python3-pip)" % sys.executable)
        r = subprocess.run([sys.executable, "-c", "import setuptools, wheel"], capture_output=True)
        if r.returncode != 0:
            self.skipTest("setuptools or wheel is absent (Debian: apt-get install python3-setuptools "
                          "python3-wheel)")
        self.d = rktest.tmpdir(self)
        self.src = os.path.join(self.d, "src")
        shutil.copytree(rktest.PYDIR, self.src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))

    def pip(self, py, *args):
        env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
        env.pop("PYTHONPATH", None)
        return subprocess.run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                               "--no-index", "-q", *args, self.src], capture_output=True, text=True,
                              env=env, timeout=300)

    def check_import(self, py, where, env=None):
        env = dict(env or os.environ)
        r = subprocess.run([py, "-c", CHECK], capture_output=True, text=True, cwd="/", env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        path, version = r.stdout.split()
        self.assertTrue(os.path.realpath(path).startswith(os.path.realpath(where)), path)
        import rekindle

        self.assertEqual(version, rekindle.__version__)

    def test_install(self):
        venv = os.path.join(self.d, "venv")
        r = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv],
                           capture_output=True, text=True)
        if r.returncode == 0:
            py = os.path.join(venv, "bin", "python")
            r = self.pip(py)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
            self.check_import(py, venv, env)
        else:  # no venv module (Debian: python3-venv): a --target directory instead
            target = os.path.join(self.d, "target")
            r = self.pip(sys.executable, "--target", target)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            env = dict(os.environ, PYTHONPATH=target)
            self.check_import(sys.executable, target, env)
        self.assertFalse(os.path.exists(os.path.join(rktest.PYDIR, "build")))


if __name__ == "__main__":
    unittest.main()
