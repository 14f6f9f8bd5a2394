"""A gRPC client that is not Corvid's: grpcio, with stubs generated from learner.proto.

    grpc_peer.py --proto-dir proto --cases cases.json

`cases.json` is a list of {"name", "url", "token", "parts"}, where each part is the hex
of one `corvid.v1.TrajectoryPart`. Each part is parsed with the generated classes and
serialised again by Python's protobuf, then the case's parts are streamed through
`SubmitTrajectory`. Prints one JSON object: for each case its status code name ("OK",
"INVALID_ARGUMENT", ...), the status details, and the ack's fields when it was acked.
learner/tests/grpc_ingest.rs runs it against a real learner.
"""

import argparse
import importlib
import json
import sys
import tempfile

import grpc
from grpc_tools import protoc


def stubs(proto_dir, out):
    """Generates and imports the learner.proto modules (messages, service stub)."""
    code = protoc.main(
        [
            "protoc",
            f"-I{proto_dir}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"{proto_dir}/corvid/v1/learner.proto",
        ]
    )
    if code != 0:
        sys.exit(f"protoc failed on {proto_dir}/corvid/v1/learner.proto ({code})")
    sys.path.insert(0, out)
    return (
        importlib.import_module("corvid.v1.learner_pb2"),
        importlib.import_module("corvid.v1.learner_pb2_grpc"),
    )


def submit(pb2, pb2_grpc, case):
    parts = [pb2.TrajectoryPart.FromString(bytes.fromhex(h)) for h in case["parts"]]
    limit = 16 << 20
    options = [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
    ]
    with grpc.insecure_channel(case["url"], options=options) as channel:
        stub = pb2_grpc.LearnerStub(channel)
        try:
            ack = stub.SubmitTrajectory(
                iter(parts),
                metadata=[("authorization", f"Bearer {case['token']}")],
                timeout=60,
            )
        except grpc.RpcError as e:
            return {"code": e.code().name, "details": e.details()}
    return {
        "code": "OK",
        "details": "",
        "ack": {
            "trajectory_id": ack.trajectory_id,
            "duplicate": ack.duplicate,
            "steps_stored": ack.steps_stored,
            "tokens_stored": ack.tokens_stored,
        },
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proto-dir", required=True)
    ap.add_argument("--cases", required=True)
    args = ap.parse_args()
    with open(args.cases) as f:
        cases = json.load(f)
    with tempfile.TemporaryDirectory() as out:
        pb2, pb2_grpc = stubs(args.proto_dir, out)
        print(json.dumps({c["name"]: submit(pb2, pb2_grpc, c) for c in cases}))


if __name__ == "__main__":
    main()
