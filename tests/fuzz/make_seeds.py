#!/usr/bin/env python3
"""Write the fuzzers' seed corpora: tests/fuzz/seeds/<fuzzer>/<name>.

A handful of valid inputs per fuzzer, built here from the formats'
definitions (docs/PROTOCOL.md, transport/tcp/tcp_wire.h, the test protos) so
they can be regenerated: python3 tests/fuzz/make_seeds.py. Crash inputs kept
as regression tests live next to them as crash-<what> and are not written
here (see README.md)."""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")

# ---- RPC wire (rpc/wire.h) -------------------------------------------------
HELLO, HELLO_ACK, REQUEST, RESPONSE, CANCEL, GOAWAY, DONE, MESSAGE, HALF_CLOSE, WINDOW, HEADERS = range(1, 12)
FF_DEADLINE, FF_RNDV, FF_STREAM, FF_END, FF_REFUSED = 1, 2, 4, 8, 16
FEAT_LARGE, FEAT_STREAM, FEAT_REFUSED = 1, 2, 4
WIRE_VERSION = 3


def rpc_hdr(typ, flags=0, status=0, md_len=0, rid=0, method=0, budget=0, payload_len=0):
    return struct.pack("<HBBBBHQIII", 0x5256, WIRE_VERSION, typ, flags, status, md_len, rid, method, budget, payload_len)


def md(entries):
    out = b""
    for k, v in entries:
        out += struct.pack("<HH", len(k), len(v)) + k + b"\0" + v
    return out


def rpc_frame(typ, body=b"", md_block=b"", **kw):
    return rpc_hdr(typ, md_len=len(md_block), payload_len=kw.pop("payload_len", len(body)), **kw) + md_block + body


def hello(max_msg=16 << 20, conc=64, feat=3, window=64):
    return struct.pack("<IIII", max_msg, conc, feat, window)


def desc(addr, rkey):
    return struct.pack("<QII", addr, rkey, 0)


ID = (1 << 32) | 3
WIRE = {
    "hello": rpc_frame(HELLO, hello()),
    "hello_ack": rpc_frame(HELLO_ACK, hello(1 << 20, 128, 1)),
    "request": rpc_frame(REQUEST, b"\x08\x01", rid=ID, method=0x1234abcd),
    "request_md_deadline": rpc_frame(REQUEST, b"\x0a\x03abc", md([(b"trace-id", b"42"), (b"x.y_z", b"")]),
                                     rid=ID, method=7, flags=FF_DEADLINE, budget=250000),
    "request_budget_ms": rpc_frame(REQUEST, b"", rid=ID, method=7, flags=FF_DEADLINE, budget=0x80000000 | 90000),
    "request_rndv": rpc_frame(REQUEST, desc(0x7f0000001000, 0x105), md([(b"k", b"v")]), rid=ID, method=9,
                              flags=FF_RNDV, payload_len=1 << 20),
    "response": rpc_frame(RESPONSE, b"\x10\x05", rid=ID),
    "response_error": rpc_frame(RESPONSE, b"no such key", rid=ID, status=5),
    "response_rndv": rpc_frame(RESPONSE, desc(0x1000, 9), rid=ID, flags=FF_RNDV, payload_len=70000),
    "response_refused": rpc_frame(RESPONSE, b"server is shutting down", rid=ID, status=14, flags=FF_REFUSED),
    "cancel": rpc_frame(CANCEL, rid=ID),
    "goaway": rpc_frame(GOAWAY, b"shutting down", status=14),
    "done": rpc_frame(DONE, rid=ID, status=0),
    "request_stream": rpc_frame(REQUEST, b"", md([(b"k", b"v")]), rid=ID, method=7, flags=FF_STREAM | FF_DEADLINE,
                                budget=250000),
    "message": rpc_frame(MESSAGE, b"\x08\x01", rid=ID),
    "message_end": rpc_frame(MESSAGE, b"", rid=ID, flags=FF_END),
    "message_rndv": rpc_frame(MESSAGE, desc(0x7f0000003000, 0x309), rid=ID, flags=FF_RNDV, payload_len=1 << 20),
    "half_close": rpc_frame(HALF_CLOSE, rid=ID),
    "window": rpc_frame(WINDOW, struct.pack("<I", 16), rid=ID),
    "headers": rpc_frame(HEADERS, b"", md([(b"initial", b"1")]), rid=ID),
    "response_trailers": rpc_frame(RESPONSE, b"", md([(b"trailer", b"x")]), rid=ID),
    "hello_window_1": rpc_frame(HELLO, hello(window=1)),
}

# ---- rendezvous: prefix of segments and a read, then a RNDV frame ------------


def rndv(segs, roff, length, peer_max, feat, eager, frame):
    return (struct.pack("<B", len(segs) - 1) + b"".join(struct.pack("<I", s) for s in segs) +
            struct.pack("<QIIII", roff, length, peer_max, feat, eager) + frame)


RNDV = {
    "one_segment": rndv([1 << 20], 0, 1 << 20, 16 << 20, 1, 8192, WIRE["request_rndv"]),
    "gathered": rndv([100, 16384, 3, 70000], 50, 20000, 1 << 20, 1, 4096, WIRE["response_rndv"]),
    "eager_only": rndv([64, 64], 64, 64, 16 << 20, 0, 8192, WIRE["request_rndv"]),
    "past_end": rndv([4096], 4000, 200, 100, 0, 8192, WIRE["response_rndv"]),
}

# ---- protobuf (tests/rpc/*.proto) --------------------------------------------


def varint(v):
    out = b""
    while v >= 0x80:
        out += bytes([(v & 0x7f) | 0x80])
        v >>= 7
    return out + bytes([v])


def key(field, wt):
    return varint(field << 3 | wt)


def f_varint(field, v):
    return key(field, 0) + varint(v & (2**64 - 1))


def f_bytes(field, b):
    return key(field, 2) + varint(len(b)) + b


def f_fixed32(field, v):
    return key(field, 5) + struct.pack("<I", v)


def f_fixed64(field, v):
    return key(field, 1) + struct.pack("<Q", v)


def node(depth, value=1):
    m = f_varint(2, value)
    if depth > 1:
        m = f_bytes(1, node(depth - 1, value + 1)) + m
    return m


# fuzz_pb: first byte picks Node, Multi, Inner, NotFlat, EchoRequest
inner = f_bytes(1, b"inner") + f_varint(2, 5)
PB = {
    "node_3": b"\x00" + node(3),
    "node_64": b"\x00" + node(64),
    "node_65_too_deep": b"\x00" + node(65),
    "node_field_2pow29": b"\x00" + f_varint(2, 5) + f_varint(1 << 29, 1),
    "multi": b"\x01" + f_bytes(1, b"a" * 10) + f_bytes(2, b"r1") + f_bytes(2, b"") + f_bytes(3, inner) +
             f_bytes(4, b"b") + f_varint(5, 3),
    "multi_big": b"\x01" + f_bytes(1, b"A" * 4100) + f_bytes(4, b"B" * 10) + f_varint(5, 1),
    "inner": b"\x02" + inner,
    "notflat_packed": b"\x03" + f_bytes(1, varint(1) + varint(2) + varint(300)) + f_varint(2, 7),
    "notflat_unpacked": b"\x03" + f_varint(1, 1) + f_varint(1, 2**64 - 1) + f_varint(2, 7),
    "echo_request_big": b"\x04" + f_bytes(1, b"p" * 4200) + f_varint(2, 9) + f_varint(4, 1),
}

# fuzz_pbflat: first byte picks All2, All3, EchoRequest, EchoReply; bit 7: pack mode
all3 = (f_varint(1, -5) + f_varint(2, 9) + f_varint(3, 7) + f_varint(4, 1 << 40) + f_varint(5, 3) +
        f_varint(6, 2**64 - 1) + f_fixed32(7, 1) + f_fixed32(8, 0xffffffff) + f_fixed64(9, 2) +
        f_fixed64(10, 3) + f_fixed32(11, 0x3fc00000) + f_fixed64(12, 0x3ff8000000000000) + f_varint(13, 1) +
        f_varint(14, 2**64 - 2) + f_bytes(15, b"str") + f_bytes(16, b"\0\1\2") + f_varint(1000000, 4))
all2 = (f_varint(1, 3) + f_bytes(2, b"required") + f_varint(3, 1) + f_varint(15, 0) + f_varint(16, 1) +
        f_bytes(17, b"s") + f_bytes(19, b"") + f_bytes(300, b"far"))
PBFLAT = {
    "all2": b"\x00" + all2,
    "all2_unknown_field": b"\x00" + all2 + f_varint(99, 1),
    "all3": b"\x01" + all3,
    "all3_repeated_field": b"\x01" + all3 + f_varint(1, 6) + f_bytes(15, b"last"),
    "echo_request": b"\x02" + f_bytes(1, b"hi") + f_varint(2, 1) + f_varint(3, 0) + f_varint(4, 2),
    "echo_reply": b"\x03" + f_bytes(1, b"") + f_varint(2, 77),
    "pack_all2": b"\x80" + bytes(range(1, 200)),
    "pack_all3": b"\x81" + bytes((i * 37) & 0xff for i in range(300)),
    "pack_echo_reply": b"\x83" + b"\x01\x00\x00\x00\x00\x00\x00\x00" * 8,
}

# ---- TCP transport stream (transport/tcp/tcp_wire.h) ---------------------------
T_DATA, T_CREDIT, T_HELLO, T_HELLO_ACK, T_READ_REQ, T_READ_RESP, T_READ_ERR = range(1, 8)


def tcp(typ, body=b"", imm=0, credits=0, length=None):
    return struct.pack("<IIHBBI", len(body) if length is None else length, imm, credits, typ, 1, 0x43505256) + body


t_hello = tcp(T_HELLO, imm=8192, credits=8)
TCP = {
    "hello_only": t_hello,
    "hello_data": t_hello + tcp(T_DATA, b"hello", imm=1) + tcp(T_DATA, b"", imm=2) + tcp(T_CREDIT, credits=2),
    "hello_rpc_frame": t_hello + tcp(T_DATA, WIRE["request"], imm=0),
    "read_req_bad_key": t_hello + tcp(T_READ_REQ, struct.pack("<QII", 0x1000, 0x105, 64), imm=7),
    "read_resp_unasked": t_hello + tcp(T_READ_RESP, b"xyz", imm=1),
    "read_err_unasked": t_hello + tcp(T_READ_ERR, imm=1),
    "data_too_big": t_hello + tcp(T_DATA, b"", length=1 << 20),
    "data_before_hello": tcp(T_DATA, b"early"),
    "zero_credits": tcp(T_HELLO, imm=8192, credits=0) + tcp(T_DATA, b"x" * 100) * 3,
}

# ---- verbs connect private data (transport/verbs/verbs_hello.c) ---------------
# prefix: u8 mode (0 hello, 1 reject), u16 our version, u32 our eager, u32 our credits, i32 cm status


def verbs(mode, pd, version=1, eager=8192, credits=64, status=0):
    return struct.pack("<BHIIi", mode, version, eager, credits, status) + pd


v_hello = struct.pack(">IHHII", 0x56525043, 1, 16, 4096, 0)
VERBS = {
    "hello": verbs(0, v_hello),
    "hello_bigger_eager": verbs(0, struct.pack(">IHHII", 0x56525043, 1, 1, 1 << 20, 0) + bytes(40)),
    "hello_old_version": verbs(0, struct.pack(">IHHII", 0x56525043, 7, 16, 4096, 0)),
    "reject_eproto": verbs(1, struct.pack(">IHH", 0x56525043, 1, 71) + b"initial credits 0, at least 1 needed".ljust(48, b"\0")),
    "reject_unterminated": verbs(1, struct.pack(">IHH", 0x56525043, 1, 111) + b"x" * 48),
    "reject_no_listener": verbs(1, b"", status=8),
}

# ---- RPC server: u16 length + RPC frame, each sent as one TCP DATA frame -------


def method_id(name):
    h = 2166136261
    for c in name.encode():
        h = ((h ^ c) * 16777619) & 0xffffffff
    return h


ECHO = method_id("/vrpctest.Test/Echo")
STREAM = method_id("/vrpctest.Test/Stream")
COUNT = method_id("/vrpctest.Test/Count")
ID1S = (1 << 32) | 4


def frames(*fs):
    return b"".join(struct.pack("<H", len(f)) + f for f in fs)


r_hello = rpc_frame(HELLO, hello(1 << 20, 8, 1))
echo_req = f_bytes(1, b"ping") + f_varint(2, 7)
RPC = {
    "call": frames(r_hello, rpc_frame(REQUEST, echo_req, rid=ID, method=ECHO)),
    "calls_md_deadline": frames(r_hello, rpc_frame(REQUEST, echo_req, md([(b"a", b"1")]), rid=ID, method=ECHO,
                                                   flags=FF_DEADLINE, budget=500000),
                                rpc_frame(REQUEST, echo_req, rid=(1 << 32) | 1, method=ECHO)),
    "call_cancel": frames(r_hello, rpc_frame(REQUEST, echo_req, rid=ID, method=ECHO), rpc_frame(CANCEL, rid=ID)),
    "unknown_method": frames(r_hello, rpc_frame(REQUEST, echo_req, rid=ID, method=1234)),
    "bad_message": frames(r_hello, rpc_frame(REQUEST, b"\x0b\x0c", rid=ID, method=ECHO)),
    "rndv_request": frames(r_hello, rpc_frame(REQUEST, desc(0x7f0000001000, 0x105), rid=ID, method=ECHO,
                                              flags=FF_RNDV, payload_len=100000)),
    "done_unasked": frames(r_hello, rpc_frame(DONE, rid=ID)),
    "no_hello": frames(rpc_frame(REQUEST, echo_req, rid=ID, method=ECHO)),
    "stream_bidi": frames(r_hello, rpc_frame(REQUEST, rid=ID, method=STREAM, flags=FF_STREAM | FF_DEADLINE,
                                             budget=500000, md_block=md([(b"k", b"v")])),
                          rpc_frame(MESSAGE, echo_req, rid=ID), rpc_frame(MESSAGE, echo_req, rid=ID),
                          rpc_frame(WINDOW, struct.pack("<I", 8), rid=ID), rpc_frame(HALF_CLOSE, rid=ID)),
    "stream_end_flag": frames(r_hello, rpc_frame(REQUEST, rid=ID, method=COUNT, flags=FF_STREAM),
                              rpc_frame(MESSAGE, echo_req, rid=ID, flags=FF_END)),
    "stream_cancel": frames(r_hello, rpc_frame(REQUEST, rid=ID, method=STREAM, flags=FF_STREAM),
                            rpc_frame(MESSAGE, echo_req, rid=ID), rpc_frame(CANCEL, rid=ID),
                            rpc_frame(MESSAGE, echo_req, rid=ID)),
    "stream_bad_rules": frames(r_hello, rpc_frame(REQUEST, rid=ID, method=COUNT, flags=FF_STREAM),
                               rpc_frame(MESSAGE, echo_req, rid=ID), rpc_frame(MESSAGE, echo_req, rid=ID),
                               rpc_frame(REQUEST, rid=ID1S, method=ECHO, flags=FF_STREAM),
                               rpc_frame(HALF_CLOSE, rid=ID1S), rpc_frame(HALF_CLOSE, rid=ID1S)),
    "stream_window_overflow": frames(r_hello, rpc_frame(REQUEST, rid=ID, method=STREAM, flags=FF_STREAM),
                                     rpc_frame(WINDOW, struct.pack("<I", 0x7fffffff), rid=ID)),
    "stream_rndv_message": frames(r_hello, rpc_frame(REQUEST, rid=ID, method=STREAM, flags=FF_STREAM),
                                  rpc_frame(MESSAGE, desc(0x7f0000001000, 0x105), rid=ID, flags=FF_RNDV,
                                            payload_len=100000)),
    "stream_on_unary": frames(r_hello, rpc_frame(REQUEST, echo_req, rid=ID, method=ECHO),
                              rpc_frame(MESSAGE, echo_req, rid=ID), rpc_frame(HEADERS, b"", md([(b"a", b"")]), rid=ID)),
}

# ---- RPC channel: the same framing, from the server's side ----------------------
r_ack = rpc_frame(HELLO_ACK, hello(1 << 20, 64, 1))
ID0, ID1 = 1 << 32, (1 << 32) | 1
echo_rep = f_bytes(1, b"pong") + f_varint(2, 7)
CHANNEL = {
    "answers": frames(r_ack, rpc_frame(RESPONSE, echo_rep, rid=ID0), rpc_frame(RESPONSE, echo_rep, rid=ID1)),
    "error_and_goaway": frames(r_ack, rpc_frame(RESPONSE, b"try later", rid=ID0, status=14),
                               rpc_frame(GOAWAY, b"draining", status=14)),
    "rndv_response": frames(r_ack, rpc_frame(RESPONSE, desc(0x7f0000002000, 0x207), rid=ID0, flags=FF_RNDV,
                                             payload_len=200000), rpc_frame(RESPONSE, echo_rep, rid=ID1)),
    "bad_reply": frames(r_ack, rpc_frame(RESPONSE, b"\x0b", rid=ID0), rpc_frame(RESPONSE, echo_rep, rid=ID0)),
    "unknown_id_done": frames(r_ack, rpc_frame(RESPONSE, echo_rep, rid=(7 << 32) | 5), rpc_frame(DONE, rid=ID1)),
    "no_ack": frames(rpc_frame(RESPONSE, echo_rep, rid=ID0)),
    "refused": frames(rpc_frame(HELLO_ACK, hello(1 << 20, 64, FEAT_LARGE | FEAT_STREAM | FEAT_REFUSED)),
                      rpc_frame(RESPONSE, b"server is shutting down", rid=ID0, status=14, flags=FF_REFUSED),
                      rpc_frame(RESPONSE, b"", rid=ID1, status=0, flags=FF_REFUSED)),
}

# A stream of the channel (slot 2): initial metadata, messages, window, the end with trailers.
r_ack_st = rpc_frame(HELLO_ACK, hello(1 << 20, 64, 3, 4))
ID2 = (1 << 32) | 2
CHANNEL["stream"] = frames(r_ack_st, rpc_frame(HEADERS, md_block=md([(b"k", b"v")]), rid=ID2),
                           rpc_frame(MESSAGE, echo_rep, rid=ID2), rpc_frame(WINDOW, struct.pack("<I", 8), rid=ID2),
                           rpc_frame(MESSAGE, echo_rep, rid=ID2),
                           rpc_frame(RESPONSE, md_block=md([(b"t", b"1")]), rid=ID2),
                           rpc_frame(RESPONSE, echo_rep, rid=ID0), rpc_frame(RESPONSE, echo_rep, rid=ID1))
CHANNEL["stream_bad"] = frames(r_ack_st, rpc_frame(MESSAGE, echo_rep, rid=ID2, flags=FF_END),
                               rpc_frame(WINDOW, struct.pack("<I", 0x7fffffff), rid=ID2),
                               rpc_frame(HEADERS, md_block=md([(b"k", b"v")]), rid=ID0))

CORPORA = {"fuzz_wire": WIRE, "fuzz_rndv": RNDV, "fuzz_pb": PB, "fuzz_pbflat": PBFLAT, "fuzz_tcp_stream": TCP,
           "fuzz_verbs_hello": VERBS, "fuzz_rpc_server": RPC,
           "fuzz_rpc_channel": CHANNEL}


def main():
    for fuzzer, seeds in CORPORA.items():
        d = os.path.join(OUT, fuzzer)
        os.makedirs(d, exist_ok=True)
        for old in os.listdir(d):
            if not old.startswith("crash-"):
                os.remove(os.path.join(d, old))
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
    print("seeds written to", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
