#!/usr/bin/env python3
"""Reads ncfsm flight-recorder dumps back with Python's own pickle and json
modules; run by tests/unit/test_recorder.c (torch is not needed).

  check_fr_dump.py values FILE
      FILE was written by the recorder's pickle writer from the values in
      test_recorder.c's test_pickle_values: it must load to VALUES below.

  check_fr_dump.py dump DIR [--timeout-ms N] [--expect-match | --expect-mismatch SEQ:KIND]
      Every ncfsm JSON dump in DIR must have its PyTorch Flight Recorder file
      beside it, and that file must hold what
      torch.distributed.flight_recorder (fr_trace, dump format "2.10") reads:
      the file-name rule of its loader, the keys and value types of its
      builder and matcher, and the values docs/ordering.md ("Dump formats")
      promises, computed here again from the JSON dump. With --expect-*, the
      collectives of all ranks of each communicator, lined up by
      collective_seq_id, must agree, or first differ at SEQ in KIND
      (type, size or dtype): what fr_trace's matcher compares.

  check_fr_dump.py fr_trace DIR match|SEQ:KIND
      Runs PyTorch's analyzer itself
      (python3 -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX)
      on the one communicator in DIR and checks its verdict; exit 77 when
      torch is not installed.
"""
import ast
import json
import os
import pickle
import re
import sys
import time

VALUES = {
    "ints": [0, 1, 255, 256, 65535, 65536, -1, -255, -256, -65536, 2147483647, -2147483648,
             2147483648, -2147483649, 9223372036854775807, -9223372036854775808],
    "uints": [0, 255, 9223372036854775807, 9223372036854775808, 18446744073709551615],
    "floats": [0.0, 0.5, -1.25, 0.1, 1e300, -2.5e-300],
    "strs": ["", "ascii", "caf\u00e9 \u4e2d\u6587 \U0001F642", "bad?x?", "??", "???", "??",
             "????", "x" * 70000],
    "bools": [True, False],
    "none": None,
    "tuple": (1, "a", None),
    "empty": [[], {}, ()],
    "nested": {"k": [{"x": [1, [2, [3]]]}]},
}

# What fr_trace's Op accepts (types.py COLLECTIVES | P2P), for the names ncfsm writes.
TORCH_TYPES = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
               "gather", "scatter", "send", "recv"}

OP_NAME = {"ALLREDUCE": "all_reduce", "BROADCAST": "broadcast", "REDUCE": "reduce",
           "ALLGATHER": "all_gather", "REDUCESCATTER": "reduce_scatter",
           "ALLTOALL": "all_to_all", "GATHER": "gather", "SCATTER": "scatter",
           "SEND": "send", "RECV": "recv"}
DTYPE = {"INT8": "Char", "UINT8": "Byte", "INT32": "Int", "UINT32": "UInt32", "INT64": "Long",
         "UINT64": "UInt64", "FLOAT16": "Half", "FLOAT32": "Float", "FLOAT64": "Double",
         "BFLOAT16": "BFloat16"}
FINAL = {"COMPLETED", "FAILED", "TIMED_OUT", "ABORTED"}
RECORD_STRIDE = 1000  # record_id = (collective seq + 1) * 1000 (+ j for the j-th send/recv after it)

ENTRY_TYPES = {
    "frames": list, "record_id": int, "pg_id": int, "process_group": tuple,
    "thread_name": str, "thread_id": str, "collective_seq_id": int, "p2p_seq_id": int,
    "op_id": int, "profiling_name": str, "time_created_ns": int, "input_sizes": list,
    "input_dtypes": list, "output_sizes": list, "output_dtypes": list, "state": str,
    "time_discovered_started_ns": (int, type(None)),
    "time_discovered_completed_ns": (int, type(None)), "retired": bool, "timeout_ms": int,
    "is_p2p": bool,
}


class Bad(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise Bad(msg)


def check_values(path):
    with open(path, "rb") as f:
        got = pickle.load(f)
    need(got == VALUES, f"{path}: loaded {got!r:.300}, want {VALUES!r:.300}")
    need(type(got["tuple"]) is tuple and type(got["empty"][2]) is tuple, "tuples did not load as tuples")
    need(all(type(b) is bool for b in got["bools"]), "bools did not load as bools")
    need(all(type(x) is int for x in got["ints"] + got["uints"]), "ints did not load as ints")
    print(f"values: {path} ok")


def sizes(op, count, nranks):
    every = count * nranks
    if op in ("ALLGATHER", "GATHER"):
        return [[count]], [[every]]
    if op in ("REDUCESCATTER", "SCATTER"):
        return [[every]], [[count]]
    if op == "ALLTOALL":
        return [[every]], [[every]]
    return [[count]], [[count]]


def torch_state(x):
    if x["state"] == "COMPLETED":
        return "completed"
    if x["state"] == "IN_FLIGHT" or (x["state"] in FINAL and x["t_final_ns"]):
        return "started"
    return "scheduled"


def expected_entries(j):
    """The PyTorch entries docs/ordering.md promises for JSON dump j."""
    ents = j["entries"]
    p2p = lambda x: x["op"] in ("SEND", "RECV")
    last_coll = max([i for i, x in enumerate(ents) if not p2p(x) and x["seq"] is not None],
                    default=-1)
    nxt = j["next_seq"]
    chosen = []
    for i, x in enumerate(ents):
        if x["op"] not in OP_NAME:
            continue
        if x["seq"] is not None:
            chosen.append((x, x["seq"]))
        elif not p2p(x):
            if i > last_coll:
                chosen.append((x, nxt))
                nxt += 1
        elif not any(y["op"] == x["op"] and y["peer"] == x["peer"] and y["seq"] is not None
                     for y in ents[i + 1:]):
            chosen.append((x, None))
    coll_seqs = [s for x, s in chosen if not p2p(x)]
    out, last, p2p_n, since = [], None, 0, 0
    for x, s in chosen:
        if not p2p(x):
            cseq = last = s
            since = 0
            record = (s + 1) * RECORD_STRIDE
            name = "nccl:" + OP_NAME[x["op"]]
        else:
            p2p_n += 1
            since = min(since + 1, RECORD_STRIDE - 1)
            if last is not None:
                cseq = last
            elif coll_seqs:
                cseq = coll_seqs[0] - 1
            else:
                cseq = j["next_seq"] - 1
            record = (cseq + 1) * RECORD_STRIDE + since
            cseq = max(cseq, 0)
            arrow = "->" if x["op"] == "SEND" else "<-"
            name = f"nccl:{OP_NAME[x['op']]} {j['rank']}{arrow}{x['peer']}"
        ins, outs = sizes(x["op"], x["count"], j["nranks"])
        out.append({"x": x, "record_id": record, "op_id": x["id"], "collective_seq_id": cseq,
                    "p2p_seq_id": p2p_n, "profiling_name": name, "input_sizes": ins,
                    "output_sizes": outs, "input_dtypes": [DTYPE[x["dtype"]]],
                    "output_dtypes": [DTYPE[x["dtype"]]], "state": torch_state(x),
                    "retired": x["state"] in FINAL, "is_p2p": p2p(x)})
    return out


def check_pair(jpath, tpath, timeout_ms):
    with open(jpath) as f:
        j = json.load(f)
    with open(tpath, "rb") as f:
        d = pickle.load(f)
    where = os.path.basename(tpath)
    need(isinstance(d, dict), f"{where}: not a dict")
    for k in ("version", "pg_config", "pg_status", "entries", "comm_lib_version"):
        need(k in d, f"{where}: no key {k}")
    v = d["version"].split(".")
    need(len(v) == 2 and all(p.isdigit() for p in v) and (int(v[0]), int(v[1])) >= (2, 7),
         f"{where}: version {d['version']!r} is not a major.minor fr_trace reads as >= 2.7")
    pg = j["comm_id"]
    need(list(d["pg_config"]) == [pg], f"{where}: pg_config keys {list(d['pg_config'])}")
    cfg = d["pg_config"][pg]
    desc = j["comm_name"] or "undefined"
    need(cfg["name"] == pg and cfg["desc"] == desc, f"{where}: pg_config {cfg}")
    need(ast.literal_eval(cfg["ranks"]) == list(range(j["nranks"])), f"{where}: ranks {cfg['ranks']}")
    nv = j["nccl_version"]
    want_lib = f"{nv // 10000}.{nv // 100 % 100}.{nv % 100}" if nv > 0 else ""
    need(d["comm_lib_version"] == want_lib, f"{where}: comm_lib_version {d['comm_lib_version']!r}")
    nc = d["ncfsm"]
    for k in ("comm_id", "rank", "nranks", "backend", "reason", "state", "failure", "next_seq",
              "rolling_hash", "capacity", "total"):
        need(nc[k] == j[k], f"{where}: ncfsm.{k} {nc[k]!r} != JSON {j[k]!r}")

    want = expected_entries(j)
    got = d["entries"]
    need(len(got) == len(want), f"{where}: {len(got)} entries, want {len(want)}")
    offsets = set()
    for g, w in zip(got, want):
        x = w.pop("x")
        at = f"{where} entry id {x['id']}"
        for k, t in ENTRY_TYPES.items():
            need(k in g, f"{at}: no key {k}")
            need(isinstance(g[k], t) and not (t is int and isinstance(g[k], bool)),
                 f"{at}: {k} is {type(g[k]).__name__}")
        for k, val in w.items():
            need(g[k] == val, f"{at}: {k} = {g[k]!r}, want {val!r}")
        need(g["process_group"] == (pg, desc), f"{at}: process_group {g['process_group']}")
        need(g["pg_id"] == 0 and g["frames"] == [], f"{at}: pg_id/frames")
        lib, name = g["profiling_name"].split(":")
        need(lib == "nccl" and name.split(" ")[0] in TORCH_TYPES, f"{at}: {g['profiling_name']}")
        for sz in (g["input_sizes"], g["output_sizes"]):
            need(all(isinstance(a, list) and all(type(i) is int for i in a) for a in sz), f"{at}: sizes")
        if timeout_ms is not None:
            need(g["timeout_ms"] == timeout_ms, f"{at}: timeout_ms {g['timeout_ms']}")
        # wall-clock times: the monotonic JSON times plus one offset per file
        for tk, jk, present in (("time_created_ns", "t_submit_ns", x["t_submit_ns"] != 0),
                                ("time_discovered_started_ns", "t_final_ns",
                                 w["state"] != "scheduled" and x["t_final_ns"] != 0),
                                ("time_discovered_completed_ns", "t_complete_ns",
                                 x["state"] == "COMPLETED" and x["t_complete_ns"] != 0)):
            if present:
                need(g[tk] is not None, f"{at}: {tk} is None")
                offsets.add(g[tk] - x[jk])
            elif tk != "time_created_ns":
                need(g[tk] is None, f"{at}: {tk} = {g[tk]}, want None")
    need(len(offsets) <= 1, f"{where}: times use {len(offsets)} clock offsets")
    if offsets:
        now_off = time.time_ns() - time.monotonic_ns()
        need(abs(offsets.pop() - now_off) < 60 * 10**9, f"{where}: times are not wall-clock ns")

    colls = [(g["collective_seq_id"], g) for g in got if not g["is_p2p"]]
    st = d["pg_status"]["0"]
    last = lambda f: max([s for s, g in colls if f(g)], default=-1)
    need(st["last_enqueued_collective"] == last(lambda g: True), f"{where}: pg_status enqueued")
    need(st["last_started_collective"] == last(lambda g: g["state"] != "scheduled"),
         f"{where}: pg_status started")
    need(st["last_completed_collective"] == last(lambda g: g["state"] == "completed"),
         f"{where}: pg_status completed")
    return j, d


def first_mismatch(dumps):
    """dumps: {rank: torch dict} of one comm. Returns (seq, kind) or None."""
    by_rank = {r: {g["collective_seq_id"]: g for g in d["entries"] if not g["is_p2p"]}
               for r, d in dumps.items()}
    seqs = sorted(set().union(*[set(m) for m in by_rank.values()]))
    for s in seqs:
        es = [m.get(s) for m in by_rank.values()]
        if any(e is None for e in es):
            return s, "missing"
        if len({e["profiling_name"] for e in es}) > 1:
            return s, "type"
        if len({repr((e["input_sizes"], e["output_sizes"])) for e in es}) > 1:
            return s, "size"
        if len({repr((e["input_dtypes"], e["output_dtypes"])) for e in es}) > 1:
            return s, "dtype"
    return None


def check_dir(dirname, timeout_ms, expect):
    files = sorted(os.listdir(dirname))
    need(not [f for f in files if f.endswith(".tmp")], f"{dirname}: temp files left: {files}")
    jre = re.compile(r"ncfsm_fr_([0-9a-f]{16})_r(\d+)\.json$")
    tre = re.compile(r"ncfsm_fr_([0-9a-f]{16})_nccl_trace_rank_(\d+)$")
    comms = {}
    for f in files:
        m = jre.fullmatch(f)
        if not m:
            need(tre.fullmatch(f), f"{dirname}: unexpected file {f}")
            continue
        comm, rank = m.group(1), int(m.group(2))
        tname = f"ncfsm_fr_{comm}_nccl_trace_rank_{rank}"
        need(tname in files, f"{dirname}: {f} has no PyTorch file {tname}")
        # fr_trace's loader: the rank is what follows the prefix, the prefix
        # being what comes before the file name's trailing digits
        prefix = re.fullmatch(r"(.*?)(\d+)", tname).group(1)
        need(prefix == f"ncfsm_fr_{comm}_nccl_trace_rank_" and int(tname[len(prefix):]) == rank,
             f"{tname}: prefix {prefix}")
        need(not re.search(r"\d$", f), f"{f}: a JSON file name must not end in a digit")
        j, d = check_pair(os.path.join(dirname, f), os.path.join(dirname, tname), timeout_ms)
        comms.setdefault(comm, {})[rank] = d
    need(comms, f"{dirname}: no dumps")
    for comm, dumps in comms.items():
        mm = first_mismatch(dumps)
        if expect == "match":
            need(mm is None, f"comm {comm}: ranks differ at {mm}")
        elif expect is not None:
            need(mm is not None and f"{mm[0]}:{mm[1]}" == expect,
                 f"comm {comm}: first difference {mm}, want {expect}")
        print(f"dump: comm {comm} ranks {sorted(dumps)} ok" +
              (f", first difference at seq {mm[0]}: {mm[1]}" if mm else ""))


FR_TRACE_SAYS = {
    "type": "COLLECTIVE_TYPE_MISMATCH",
    "size": "SIZE_OR_SYNTAX_MISMATCH",
    "dtype": "COLLECTIVE_DTYPE_MISMATCH",
    "missing": "Not all ranks joining collective",
}


def run_fr_trace(dirname, expect):
    """Runs PyTorch's own analyzer on DIR (one communicator) and checks its
    verdict. Exit 77 when torch's flight_recorder cannot be imported."""
    import importlib.util
    import subprocess
    try:
        spec = importlib.util.find_spec("torch.distributed.flight_recorder.fr_trace")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        print("fr_trace: torch.distributed.flight_recorder is not installed: not run")
        return 77
    names = [f for f in os.listdir(dirname) if re.fullmatch(r"ncfsm_fr_[0-9a-f]{16}_nccl_trace_rank_\d+", f)]
    prefixes = {re.fullmatch(r"(.*?)\d+", f).group(1) for f in names}
    need(len(prefixes) == 1, f"{dirname}: {len(prefixes)} communicators; fr_trace takes one prefix")
    cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", dirname,
           "-p", prefixes.pop()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    print(f"fr_trace: {' '.join(cmd[1:])}: exit {r.returncode}")
    print("\n".join("  | " + line for line in out.splitlines()[-12:]))
    need(r.returncode == 0 and "Traceback" not in out, "fr_trace failed")
    if expect == "match":
        need("has errors" not in out and "Not all ranks" not in out, "fr_trace found a problem")
    else:
        seq, kind = expect.split(":")
        need(FR_TRACE_SAYS[kind] in out, f"fr_trace did not say {FR_TRACE_SAYS[kind]}")
        need(f"sequence number: {seq}" in out, f"fr_trace did not name sequence number {seq}")
    return 0


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "values":
            check_values(argv[2])
        elif len(argv) >= 3 and argv[1] == "dump":
            timeout_ms, expect, rest = None, None, argv[3:]
            while rest:
                if rest[0] == "--timeout-ms":
                    timeout_ms, rest = int(rest[1]), rest[2:]
                elif rest[0] == "--expect-match":
                    expect, rest = "match", rest[1:]
                elif rest[0] == "--expect-mismatch":
                    expect, rest = rest[1], rest[2:]
                else:
                    raise Bad(f"unknown argument {rest[0]}")
            check_dir(argv[2], timeout_ms, expect)
        elif len(argv) == 4 and argv[1] == "fr_trace":
            return run_fr_trace(argv[2], argv[3])
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (Bad, KeyError, ValueError, TypeError, pickle.UnpicklingError, EOFError) as e:
        print(f"check_fr_dump: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
