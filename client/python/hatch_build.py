"""Hatch plugins of this package, run while a wheel or an sdist is built:

- checkout_version(), the version source ([tool.hatch.version] in pyproject.toml): the one
  version of the repository, <repo>/VERSION. It also copies <repo>/LICENSE here, where the
  packaging metadata (license-files) can name it; both copies are ignored by git.
- ProtoBuildHook: generates the protobuf and gRPC modules from the repository's .proto files,
  and src/jobbroker/_version.py (`__version__`, sent in the "jobbroker-client" call metadata).

The protos live at <repo>/proto/jobbroker/v1/*.proto, two folders above this package, so the
modules land in src/jobbroker/v1/ as jobbroker.v1.broker_pb2 etc. and their own imports
(`from jobbroker.v1 import job_pb2`) resolve inside this package. An sdist carries the generated
files, LICENSE and its version (in PKG-INFO, which hatchling reads instead of calling the version
source), so building a wheel from it needs neither the proto folder nor the repository.
"""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent


def checkout_version() -> str:
    """<repo>/VERSION, and a fresh copy of <repo>/LICENSE beside pyproject.toml."""
    version_file = REPO / "VERSION"
    if not version_file.is_file():
        raise RuntimeError(f"{version_file} is missing: build from a jobbroker checkout or an sdist")
    sync_license()
    return version_file.read_text().strip()


def sync_license() -> None:
    source, copy = REPO / "LICENSE", HERE / "LICENSE"
    if source.is_file() and (not copy.is_file() or copy.read_bytes() != source.read_bytes()):
        shutil.copyfile(source, copy)


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = pathlib.Path(self.root)
        write_if_changed(
            root / "src" / "jobbroker" / "_version.py",
            '"""The package\'s version: written by hatch_build.py at build time from the '
            'repository\'s\nVERSION file (not in git); sent in the "jobbroker-client" call '
            'metadata."""\n\n'
            f'__version__ = "{self.metadata.version}"\n',
        )
        if (root / "PKG-INFO").is_file():
            return  # built from an sdist: the modules are generated already
        sync_license()
        proto_root = (root / ".." / ".." / "proto").resolve()
        protos = sorted((proto_root / "jobbroker" / "v1").glob("*.proto"))
        if not protos:
            raise RuntimeError(f"no .proto files under {proto_root}/jobbroker/v1")
        generate(proto_root, protos, root / "src")


def write_if_changed(path: pathlib.Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def generate(proto_root: pathlib.Path, protos: list[pathlib.Path], out: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc

    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *[str(p) for p in protos],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("grpc_tools.protoc failed: " + " ".join(args))
