"""A BPF stack map hashes each stack into one bucket and never chains: a stack whose bucket
holds another one (or that finds the map full) cannot be stored there. gpuscope then sends the
stack's frames in the ring buffer instead, so such a stack is not lost. A one-entry map makes
every stack but the first collide: the recording must be the same as with a roomy map."""
from conftest import TARGETS
from test_flamegraph import folded, share


def lost(rec):
    return rec.query("SELECT cause, count FROM lost WHERE count > 0")


def without_process(stacks):
    """Folded stacks without their root, the process ("cuda_ops (PID)")."""
    out = {}
    for k, v in stacks.items():
        out[k[1:]] = out.get(k[1:], 0) + v
    return out


def test_call_stacks_that_collide_are_sent_whole(record, gpuscope):
    args = ("--", TARGETS / "cuda_ops", "--threads", 4, "--iterations", 50)
    roomy = record(*args)
    tiny = record("--stack-map-entries", 1, *args)
    for rec in (roomy, tiny):
        assert rec.returncode == 3, rec.stderr
        assert lost(rec) == []
        assert rec.scalar("SELECT count(*) FROM calls WHERE stack_id IS NULL AND func != 60") == 0
    # The same stacks, call for call: none lost, none given to another call.
    assert without_process(folded(gpuscope, tiny, "launches")) == without_process(folded(gpuscope, roomy, "launches"))
    assert share(folded(gpuscope, tiny, "launches"), "(anonymous namespace)::work(int)") == 1


def test_sampled_stacks_that_collide_are_sent_whole(record, gpuscope):
    rec = record("--cpu-profile", 199, "--sample-unwind", "fp", "--stack-map-entries", 1, "--",
                 TARGETS / "busy_loop", 1)
    assert rec.returncode == 0, rec.stderr
    assert lost(rec) == []
    stacks = folded(gpuscope, rec, "cpu")
    assert sum(stacks.values()) >= 100  # 1 s at 199 Hz
    assert share(stacks, "spin_in_user_space") > 0.5
    assert share(stacks, "main") > 0.9
