"""RDMA verbs (issue 34) through the real libibverbs with a stand-in provider in a file of its own
(tests/targets/rdma_calls.c, rdma_standin.c): the control path probed in libibverbs, the data path
(verbs.h's inline ibv_post_send, ibv_post_recv, ibv_poll_cq) in the provider's functions that
gpuscope found through the context's ops table; work requests, completions, their latency, memory
registrations, QP states, and the report's RDMA section. There is no RDMA device in CI."""
import json
import math

import pytest

from conftest import TARGETS

RDMA_CALLS = TARGETS / "rdma_calls"
SEND, RDMA_WRITE, RDMA_READ = "send", "rdma_write", "rdma_read"

pytestmark = pytest.mark.skipif(not RDMA_CALLS.exists(), reason="built without libibverbs-dev")


@pytest.fixture(scope="module")
def rdma_record(tmp_path_factory):
    import subprocess
    from conftest import GPUSCOPE
    from conftest import Record
    out = tmp_path_factory.mktemp("rdma") / "run.gpuscope"
    proc = subprocess.run([str(GPUSCOPE), "record", "-o", str(out), "--", str(RDMA_CALLS)],
                          capture_output=True, text=True, timeout=120)
    return Record(out, proc)


def test_control_path_calls_with_their_arguments(rdma_record):
    rec = rdma_record
    assert rec.returncode == 0, rec.stderr
    program = json.loads(rec.stdout)
    assert program["data_path_probed"] == 1, rec.stderr
    assert "RDMA verbs functions" in rec.stderr, rec.stderr
    calls = rec.query("SELECT func, ok, ret, qp_num, qp_type, sq_sig_all, state, prev_state, dest_qp_num, attr_mask, "
                      "length, access, lkey, rkey, dmabuf_fd, cqe FROM rdma_calls ORDER BY ts_ns")
    assert [c[0] for c in calls] == [
        "ibv_create_cq", "ibv_create_cq", "ibv_create_qp", "ibv_create_qp", "ibv_modify_qp", "ibv_modify_qp",
        "ibv_modify_qp", "ibv_reg_mr", "ibv_reg_dmabuf_mr", "ibv_create_qp", "ibv_modify_qp", "ibv_dereg_mr",
        "ibv_dereg_mr", "ibv_destroy_qp", "ibv_destroy_qp", "ibv_destroy_qp", "ibv_destroy_cq", "ibv_destroy_cq"], calls
    assert all(c[1] == 1 for c in calls), calls
    assert [c[15] for c in calls[:2]] == [64, 8]
    # QPs 0x101 (signalled sends only) and 0x102 (sq_sig_all), reliable connected.
    assert [c[3:6] for c in calls[2:4]] == [(0x101, "RC", 0), (0x102, "RC", 1)]
    # RESET -> INIT -> RTR (peer 0x2a7) -> RTS, each with the attribute mask the program passed.
    init_mask, rtr_mask, rts_mask = program["masks"]
    assert [c[3] for c in calls[4:7]] == [0x101] * 3
    assert [c[6:10] for c in calls[4:7]] == [("INIT", "RESET", None, init_mask), ("RTR", "INIT", 0x2a7, rtr_mask),
                                            ("RTS", "RTR", None, rts_mask)], calls[4:7]
    # Registrations: 64 KiB (local and remote write), a 1 MiB dma-buf (fd 9); keys from the provider;
    # deregistered with what they covered.
    assert calls[7][10:16] == (65536, 1 | 2, 0x1000, 0x1001, None, None), calls[7]
    assert calls[8][10:16] == (1 << 20, 1, 0x1002, 0x1003, 9, None), calls[8]
    assert calls[9][3:8] == (0x103, "RC", 0, None, None) and calls[10][3:8] == (0x103, None, None, "RTS", "RESET")
    assert [c[10] for c in calls[11:13]] == [65536, 1 << 20]
    assert [c[12:14] for c in calls[11:13]] == [(0x1000, 0x1001), (0x1002, 0x1003)]
    assert [c[3] for c in calls[13:16]] == [0x101, 0x102, 0x103]


def test_work_requests_as_posted(rdma_record):
    rec = rdma_record
    wrs = rec.query("SELECT post_id, qp_num, queue, wr_id, opcode, num_sge, bytes, signaled, remote_addr, rkey "
                    "FROM rdma_work_requests ORDER BY id")
    assert wrs[:6] == [
        (1, 0x101, "recv", 0x11, "recv", 1, 4096, 1, None, None),
        (1, 0x101, "recv", 0x12, "recv", 2, 1024 + 2048, 1, None, None),
        (2, 0x101, "send", 0x21, SEND, 1, 512, 1, None, None),
        (2, 0x101, "send", 0x22, RDMA_WRITE, 2, 1000 + 24, 0, 0xdead0000, 0x77),
        (2, 0x101, "send", 0x23, RDMA_READ, 1, 8192, 1, 0xbeef0000, 0x78),
        # Unsignalled, on the sq_sig_all QP: it completes.
        (3, 0x102, "send", 0x31, SEND, 1, 64, 1, None, None),
    ], wrs[:6]
    # A list of 20: the first 16 carried, the other 4 counted lost.
    assert wrs[6:] == [(4, 0x102, "recv", 0x100 + i, "recv", 1, 100, 1, None, None) for i in range(16)], wrs[6:]
    assert rec.scalar("SELECT count FROM lost WHERE cause = 'verbs_items'") == 4


def test_completions_with_status_length_and_latency(rdma_record):
    rec = rdma_record
    program = json.loads(rec.stdout)
    assert program["completions"] == 5 and program["long_completions"] == 20, program
    wcs = rec.query("SELECT qp_num, wr_id, status, status_code, opcode, byte_len, wr_opcode, latency_ns > 0 "
                    "FROM rdma_completions ORDER BY id")
    assert wcs[:5] == [
        (0x101, 0x11, "success", 0, "recv", 4000, None, 1),
        (0x101, 0x12, "success", 0, "recv", 3072, None, 1),
        (0x101, 0x21, "success", 0, SEND, 512, SEND, 1),
        # Failed: no opcode (not valid in a failed completion), named as ibv_wc_status_str names it.
        (0x101, 0x23, "remote access error", 10, None, 0, RDMA_READ, 1),
        (0x102, 0x31, "success", 0, SEND, 64, SEND, 1),
    ], wcs[:5]
    assert program["statuses"] == [0, 0, 0, 10, 0]
    # The long list's 20 completions: the 16 posts seen are matched, the 4 counted lost are not.
    assert [(w[1], w[7]) for w in wcs[5:]] == [(0x100 + i, 1 if i < 16 else None) for i in range(20)], wcs[5:]
    # The empty poll made no row; every completion's latency runs from its post to its poll's return.
    assert program["empty"] == 0
    assert rec.scalar("SELECT count(*) FROM rdma_completions c JOIN rdma_work_requests w ON w.qp_num = c.qp_num "
                      "AND w.wr_id = c.wr_id AND w.queue = CASE WHEN c.opcode = 'recv' OR c.wr_opcode IS NULL "
                      "THEN 'recv' ELSE 'send' END WHERE c.latency_ns != c.ts_ns - w.ts_ns") == 0


def test_a_provider_function_in_anonymous_memory_is_skipped_and_counted(rdma_record):
    rec = rdma_record
    # The second context's post_recv lies in an anonymous mapping; its poll_cq in the stand-in.
    assert rec.scalar("SELECT count FROM lost WHERE cause = 'verbs_provider_unmapped'") == 1, rec.stderr
    assert "verbs_provider_unmapped" in rec.stderr
    assert rec.scalar("SELECT value FROM meta WHERE key = 'rdma_provider_functions'") == "4"


def test_report_section(rdma_record, gpuscope):
    rec = rdma_record
    doc = json.loads(gpuscope("report", "--json", rec.path).stdout)
    (proc,) = doc["rdma"]
    qps = {q["qp_num"]: q for q in proc["qps"]}
    assert set(qps) == {0x101, 0x102, 0x103}
    # Connected, nothing posted or completed through the provider: said (direct verbs, or idle).
    assert qps[0x103]["no_posts_seen"] and qps[0x103]["state"] == "RTS", qps[0x103]
    assert not any(q.get("no_posts_seen") for n, q in qps.items() if n != 0x103)
    a, b = qps[0x101], qps[0x102]
    # The last state each was moved to (0x102 never was); both destroyed at the end.
    assert (a["type"], a["state"], a["peer_qp_num"], a["destroyed"]) == ("RC", "RTS", 0x2a7, True)
    assert (b["type"], b["state"], b["destroyed"]) == ("RC", "RESET", True)
    assert a["ops"] == {"recv": {"work_requests": 2, "bytes": 7168}, SEND: {"work_requests": 1, "bytes": 512},
                        RDMA_WRITE: {"work_requests": 1, "bytes": 1024}, RDMA_READ: {"work_requests": 1, "bytes": 8192}}
    assert (a["work_requests"], a["bytes"], a["completions"]) == (5, 7168 + 512 + 1024 + 8192, 4)
    assert a["errors"] == {"remote access error": 1}
    assert b["ops"] == {"recv": {"work_requests": 16, "bytes": 1600}, SEND: {"work_requests": 1, "bytes": 64}}
    assert (b["completions"], b["errors"], b["sq_sig_all"], b["latency_matched"]) == (21, {}, True, 17)
    assert "peer_qp_num" not in b
    # p50 and p99 of the matched latencies (nearest rank), as the record holds them.
    for qp, q in list(qps.items())[:2]:
        lat = sorted(r[0] for r in rec.query(
            "SELECT latency_ns FROM rdma_completions WHERE qp_num = ? AND latency_ns IS NOT NULL", qp))
        assert q["latency_p50_ns"] == lat[math.ceil(0.5 * len(lat)) - 1]
        assert q["latency_p99_ns"] == lat[math.ceil(0.99 * len(lat)) - 1]
    assert proc["memory_registrations"] == {"count": 2, "bytes": 65536 + (1 << 20), "deregistered": 2, "failed": 0}
    assert "direct_verbs" not in proc
    text = gpuscope("report", rec.path).stdout
    assert "none seen *" in text and "posted past them" in text, text
    assert "RDMA (verbs)" in text and "0x2a7" in text and "RTS (destroyed)" in text, text
    assert "1 remote access error" in text and "2 memory regions registered (1.06 MiB), 2 deregistered" in text, text


def test_a_process_without_libibverbs_gets_nothing_of_it(record):
    rec = record("--", "/bin/true")
    assert rec.returncode == 0, rec.stderr
    assert "RDMA" not in rec.stderr and "verbs" not in rec.stderr, rec.stderr
    assert rec.scalar("SELECT count(*) FROM rdma_calls") == 0
    assert rec.scalar("SELECT count(*) FROM rdma_work_requests") == 0
    assert rec.scalar("SELECT count(*) FROM lost WHERE cause LIKE 'verbs_provider%'") == 0
