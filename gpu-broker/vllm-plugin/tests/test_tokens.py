"""The token log's keys and what it sends, against a recording client."""

from types import SimpleNamespace

from belayer_vllm import wire
from belayer_vllm.tokens import TokenLog, front_request_id, log_id


class Recorder:
    def __init__(self):
        self.admitted, self.commits = [], []

    def admit(self, rid, params, prompt):
        self.admitted.append((rid, params, prompt))

    def commit(self, entries):
        self.commits.append(entries)


def test_front_ids_survive_vllms_decoration():
    rid = 0x0123456789ABCDEF
    assert log_id(f"cmpl-{front_request_id(rid)}-0-1a2b3c") == rid
    assert log_id(f"chatcmpl-{front_request_id(rid)}") == rid
    assert log_id("cmpl-random") == log_id("cmpl-random") != log_id("cmpl-other")


def test_admit_commit_finish():
    rec = Recorder()
    tl = TokenLog(rec)
    sp = SimpleNamespace(temperature=0.0, top_k=-1, seed=None, max_tokens=8)
    new = SimpleNamespace(req_id="cmpl-blyr-00000000000000aa-0", prompt_token_ids=[1, 2, 3], sampling_params=sp)
    tl.on_schedule(SimpleNamespace(scheduled_new_reqs=[new], finished_req_ids=set()))
    assert rec.admitted == [(0xAA, wire.SamplingParams(0.0, 0, 0, 8), [1, 2, 3])]
    tl.on_output(SimpleNamespace(req_ids=["cmpl-blyr-00000000000000aa-0"], sampled_token_ids=[[7]]))
    tl.on_output(SimpleNamespace(req_ids=["cmpl-blyr-00000000000000aa-0"], sampled_token_ids=[[8]]))
    tl.on_output(SimpleNamespace(req_ids=["unknown"], sampled_token_ids=[[9]]))
    tl.on_schedule(SimpleNamespace(scheduled_new_reqs=[], finished_req_ids={"cmpl-blyr-00000000000000aa-0"}))
    assert rec.commits == [
        [wire.CommitEntry(0xAA, 0, [7], 0, False)],
        [wire.CommitEntry(0xAA, 1, [8], 0, False)],
        [wire.CommitEntry(0xAA, 2, [], 0, True)],
    ]
