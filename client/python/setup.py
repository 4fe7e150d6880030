"""Build steps pyproject.toml cannot express: the version from the repository's VERSION file
and the protocol's Python stubs generated from proto/conveyor/v1/conveyor.proto."""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
PROTO_DIR = os.path.join(REPO, "proto")
PROTO = os.path.join("conveyor", "v1", "conveyor.proto")


def version():
    """One version for the whole project: VERSION at the top of the repository (or the one
    recorded in an earlier build of this package)."""
    path = os.path.join(REPO, "VERSION")
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    with open(os.path.join(HERE, "conveyor", "_version.py")) as f:
        return f.read().split('"')[1]


def generate_stubs(out_dir):
    """conveyor/v1/conveyor_pb2.py and conveyor_pb2_grpc.py under out_dir."""
    out_dir = os.path.abspath(out_dir)
    if not os.path.exists(os.path.join(PROTO_DIR, PROTO)):
        # pip copies this directory alone to build it unless told otherwise; the stubs come
        # from the repository's proto/.
        sys.exit(f"conveyor-client: {os.path.join(PROTO_DIR, PROTO)} is not there: install from a checkout of the "
                 "whole conveyor repository (pip install ./client/python from its top), not from a copy of "
                 "client/python alone")
    os.makedirs(os.path.join(out_dir, "conveyor", "v1"), exist_ok=True)
    protoc, plugin = shutil.which("protoc"), shutil.which("grpc_python_plugin")
    if protoc and plugin:
        cmd = [protoc, f"--proto_path={PROTO_DIR}", f"--python_out={out_dir}", f"--grpc_out={out_dir}",
               f"--plugin=protoc-gen-grpc={plugin}", PROTO]
    else:
        try:
            import grpc_tools  # noqa: F401
        except ImportError:
            sys.exit("conveyor-client: generating the protocol's stubs needs protoc and grpc_python_plugin "
                     "(Debian: apt-get install protobuf-compiler protobuf-compiler-grpc) or grpc_tools")
        cmd = [sys.executable, "-m", "grpc_tools.protoc", f"--proto_path={PROTO_DIR}", f"--python_out={out_dir}",
               f"--grpc_python_out={out_dir}", PROTO]
    subprocess.run(cmd, check=True, cwd=PROTO_DIR)
    open(os.path.join(out_dir, "conveyor", "v1", "__init__.py"), "a").close()


class BuildPy(build_py):
    def run(self):
        super().run()
        generate_stubs(self.build_lib)
        with open(os.path.join(self.build_lib, "conveyor", "_version.py"), "w") as f:
            f.write(f'__version__ = "{version()}"\n')


setup(version=version(), cmdclass={"build_py": BuildPy})
