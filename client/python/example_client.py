#!/usr/bin/python3
"""Example infoflow-server client in Python (Debian python3-grpcio).

Generates the stubs from proto/ into a temp dir at run time (needs
python3-grpc-tools), ingests a few chunks, then streams an answer over them
and prints the report.

    /usr/bin/python3 client/python/example_client.py --server 127.0.0.1:50051
    /usr/bin/python3 client/python/example_client.py --chat qwen     # Qwen2.5/Qwen3 server
    /usr/bin/python3 client/python/example_client.py --chat llama3   # Llama-3.x Instruct server

--chat sends the chat format as QueryRequest.prefix (system prompt + user
header, before the chunks; stored by the server, so it is prefilled once) and
prompt_template (question + assistant header): the same strings as
`infoflow query --chat` (client/chat_presets.h, README.md "Instruct models").
"""
import argparse
import importlib
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))


def load_stubs():
    out = tempfile.mkdtemp(prefix="infoflow_py_")
    # Well-known types (google/protobuf/wrappers.proto) ship with grpc_tools
    # or the system protobuf headers.
    wkt = [d for d in (os.path.join(os.path.dirname(protoc.__file__), "_proto"), "/usr/include")
           if os.path.exists(os.path.join(d, "google/protobuf/wrappers.proto"))]
    for rel in ("infoflow/v1/infoflow.proto", "grpc/health/v1/health.proto"):
        rc = protoc.main(["protoc", f"-I{PROTO_ROOT}"] + [f"-I{d}" for d in wkt[:1]] + [
                          f"--python_out={out}",
                          f"--grpc_python_out={out}", rel])
        if rc != 0:
            sys.exit(f"protoc failed on {rel}")
    # protoc writes packages without __init__.py; namespace packages import fine.
    sys.path.insert(0, out)
    pb = importlib.import_module("infoflow.v1.infoflow_pb2")
    rpc = importlib.import_module("infoflow.v1.infoflow_pb2_grpc")
    return pb, rpc


# name -> (prefix with {system}, prompt_template with {question}); the same as
# client/chat_presets.cc.
CHAT_PRESETS = {
    "qwen": ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n",
             "\n\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"),
    "llama3": ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}"
               "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
               "\n\nQuestion: {question}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"),
    "mistral": ("<s>[INST] {system}\n\n", "\n\nQuestion: {question} [/INST]"),
    "glm4": ("[gMASK]<sop><|system|>\n{system}<|user|>\n",
             "\n\nQuestion: {question}<|assistant|>\n"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default="127.0.0.1:50051")
    ap.add_argument("--token-file", help="bearer token file (server --auth-token-file)")
    ap.add_argument("--method", default="UNSPECIFIED",
                    help="INFOFLOW_BLEND, INFOFLOW, FULL, ... (default: the server's, INFOFLOW_BLEND)")
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--chat", choices=sorted(CHAT_PRESETS),
                    help="send the model family's chat format as prefix + template")
    ap.add_argument("--system", default="You are a helpful assistant.",
                    help="system prompt for --chat")
    args = ap.parse_args()

    pb, rpc = load_stubs()
    metadata = []
    if args.token_file:
        with open(args.token_file) as f:
            metadata.append(("authorization", "Bearer " + f.read().strip()))
    channel = grpc.insecure_channel(args.server)
    ingest = rpc.ChunkIngestStub(channel)
    query = rpc.QueryStub(channel)
    admin = rpc.AdminStub(channel)

    info = admin.ModelInfo(pb.ModelInfoRequest(), metadata=metadata)
    print(f"model {info.name} ({info.model_type}, {info.n_layers} layers), "
          f"stop ids {list(info.stop_ids)}, "
          f"bos {info.bos_token_id.value if info.HasField('bos_token_id') else 'none'}",
          file=sys.stderr)

    texts = [
        "The lighthouse keeper wrote every storm into a red notebook.",
        "The red notebook is kept in the drawer of the captain's desk.",
        "Ships pass the lighthouse twice a day when the tide is high.",
    ]
    req = pb.IngestRequest(chunks=[pb.IngestChunk(text=t.encode(), client_id=f"c{i}")
                                   for i, t in enumerate(texts)])
    resp = ingest.Ingest(req, metadata=metadata)
    keys = []
    for r in resp.results:
        print(f"{r.client_id}: {pb.ChunkStatus.Name(r.status)} {r.chunk_key[:16]}… "
              f"{r.n_tokens} tokens", file=sys.stderr)
        keys.append(r.chunk_key)

    prefix, template = b"", b"\nQuestion: {question}\nAnswer:"
    if args.chat:
        p, t = CHAT_PRESETS[args.chat]
        prefix, template = p.replace("{system}", args.system).encode(), t.encode()
    qreq = pb.QueryRequest(
        chunks=[pb.QueryChunk(key=k) for k in keys],
        question=b"Where is the notebook kept?",
        prefix=prefix,  # before the chunks; special tokens parsed; cached by the server
        prompt_template=template,
        parse_special=False,  # the question stays plain text
        method=pb.Method.Value("METHOD_" + args.method.upper()),
        max_new_tokens=args.max_new_tokens,
        return_report=True,
    )
    report = None
    for msg in query.Query(qreq, metadata=metadata):
        if msg.HasField("token"):
            sys.stdout.write(msg.token.text)
            sys.stdout.flush()
        elif msg.HasField("report"):
            report = msg.report
    print()
    if report is not None:
        print(f"ttft {report.ttft_ms:.2f} ms, context {report.context_tokens} tokens, "
              f"recomputed {report.recomputed_tokens}, hits {report.chunk_hits}, "
              f"misses {report.chunk_misses}, order {list(report.chunk_order)}, "
              f"prefix {report.prefix_tokens} tokens "
              f"({'from store' if report.prefix_cached else 'prefilled or none'}), "
              f"stop {report.stop_reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
