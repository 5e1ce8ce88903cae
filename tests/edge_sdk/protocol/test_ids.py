"""Message and transfer ids: random, unique, and a forked child's are its own."""

import os
import re
import threading

import pytest

from edge_sdk.protocol.ids import new_id
from edge_sdk.protocol.messages import Ack, Envelope


def test_ids_are_32_hex_digits_and_do_not_repeat_across_pool_refills():
    ids = [new_id() for _ in range(5_000)]  # about 20 reads of the pool
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    assert Envelope.of(Ack("ok"), "dev1").msg_id != Envelope.of(Ack("ok"), "dev1").msg_id


def test_threads_taking_ids_at_once_never_share_one():
    taken: list[list[str]] = [[] for _ in range(4)]

    def take(out: list[str]) -> None:
        out.extend(new_id() for _ in range(2_000))
    threads = [threading.Thread(target=take, args=(out,)) for out in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for out in taken for i in out]
    assert len(set(every)) == len(every) == 8_000


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_next_ids():
    new_id()  # the pool holds unread ids now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, "".join(new_id() for _ in range(3)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read()
    os.waitpid(pid, 0)
    parent = "".join(new_id() for _ in range(3))
    assert len(child) == len(parent) == 96 and child != parent
