"""Regenerate rnn2jax/proto/caffe2_pb2.py, metanet_pb2.py and hsm_pb2.py from their .proto files with grpcio-tools'
bundled protoc.

Run from anywhere: `python scripts/generate_proto.py [OUT_DIR]`. With OUT_DIR the modules are written
there instead (the test that checks the committed modules uses this).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = (Path("rnn2jax/proto/caffe2.proto"), Path("rnn2jax/proto/metanet.proto"), Path("rnn2jax/proto/hsm.proto"))


def generate(out_dir: Path) -> list[Path]:
    from grpc_tools import protoc  # imported here: only this script needs the generator

    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"--proto_path={ROOT}", f"--python_out={out_dir}", *map(str, PROTOS)]
    status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    return [out_dir / proto.with_name(f"{proto.stem}_pb2.py") for proto in PROTOS]


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for path in generate(out):
        print(path)
