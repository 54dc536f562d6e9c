"""dualtrain.launch.peers: a failed collective's error text becomes one line naming the lost peer,
and the failure asks for an exit without interpreter teardown (RunFailed.hard_exit)."""

from __future__ import annotations

from dualtrain.launch.peers import Peer, is_comm_error, lost_peer

PEERS = [
    Peer(rank=0, host="a", address="10.0.0.1"),
    Peer(rank=1, host="b", address="10.0.0.2", markers=("/job:worker/replica:0/task:1",)),
]


def test_a_reset_connection_names_the_peer_by_its_address():
    text = (
        "[../gloo/transport/tcp/pair.cc:534] Read error [10.0.0.2]:47249: Connection reset by peer"
    )
    exc = lost_peer("torch", 0, text, PEERS, timeout_s=60, step=77)
    assert str(exc) == (
        "torch rank 0 lost its peer rank 1 (10.0.0.2, host b) after step 77: "
        "Read error [10.0.0.2]:47249: Connection reset by peer"
    )
    assert exc.rank == 1
    assert exc.hard_exit  # the torch CLI exited -6 in interpreter teardown without it


def test_a_tf_task_name_names_the_peer():
    text = "Socket closed\nAdditional GRPC error information from /job:worker/replica:0/task:1"
    exc = lost_peer("tf", 0, text, PEERS, timeout_s=60, step=None)
    assert "lost its peer rank 1 (10.0.0.2, host b) before the first step: Socket closed" in str(
        exc
    )


def test_a_timeout_without_an_address_blames_the_only_other_rank():
    exc = lost_peer("torch", 1, "Timed out waiting 60000ms for recv", PEERS, timeout_s=60, step=5)
    assert "its peer rank 0 (10.0.0.1, host a) did not answer within" in str(exc)
    assert "distribution.timeout_s=60s after step 5" in str(exc)
    assert exc.rank == 0 and exc.hard_exit


def test_an_unattributed_failure_still_exits_hard():
    exc = lost_peer("torch", 0, "gloo: collective failed", PEERS, timeout_s=60, step=3)
    assert str(exc) == "torch rank 0: a collective failed after step 3: gloo: collective failed"
    assert exc.rank is None and exc.hard_exit


def test_a_bug_in_the_step_is_not_a_communication_error():
    assert not is_comm_error("mat1 and mat2 shapes cannot be multiplied (64x784 and 100x10)")
    assert is_comm_error("Connection closed by peer [10.0.0.2]:41235")
