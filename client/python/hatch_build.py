"""Hatch build hook: generates the protobuf and gRPC modules from the repository's .proto files.

The protos live at <repo>/proto/jobbroker/v1/*.proto, two folders above this package, so the
modules land in src/jobbroker/v1/ as jobbroker.v1.broker_pb2 etc. and their own imports
(`from jobbroker.v1 import job_pb2`) resolve inside this package. An sdist carries the generated
files, so building a wheel from it needs no proto folder.
"""

from __future__ import annotations

import pathlib
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class ProtoBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = pathlib.Path(self.root)
        proto_root = (root / ".." / ".." / "proto").resolve()
        out_dir = root / "src" / "jobbroker" / "v1"
        protos = sorted((proto_root / "jobbroker" / "v1").glob("*.proto"))
        if not protos:
            if list(out_dir.glob("*_pb2.py")):
                return  # built from an sdist: already generated
            raise RuntimeError(f"no .proto files under {proto_root}/jobbroker/v1")
        generate(proto_root, protos, root / "src")


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
