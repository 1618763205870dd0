"""Regenerate rnn2jax/proto/caffe2_pb2.py from caffe2.proto with grpcio-tools' bundled protoc.

Run from anywhere: `python scripts/generate_proto.py [OUT_DIR]`. With OUT_DIR the module is written
there instead (the test that checks the committed module uses this).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("rnn2jax/proto/caffe2.proto")


def generate(out_dir: Path) -> Path:
    from grpc_tools import protoc  # imported here: only this script needs the generator

    out_dir.mkdir(parents=True, exist_ok=True)
    status = protoc.main(["protoc", f"--proto_path={ROOT}", f"--python_out={out_dir}", str(PROTO)])
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")
    return out_dir / PROTO.with_name("caffe2_pb2.py")


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    print(generate(out))
