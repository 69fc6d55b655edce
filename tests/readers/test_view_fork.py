"""A forked child's inherited store-backed views never show another
sample's bytes: the child pins, for itself, the areas its inherited views
show, so the parent dropping its views and the generators moving on never
recycle those areas under the child; the child's own releases drop only its
own pins."""
import os

import numpy as np
import torch

import whlib
from test_views import put_and_seal, view_all

# pytest.mark.asan is left off: os.fork under the sanitizer build's
# interposed allocator is outside what these tests check


def area_pins(st, gen):
    """(pins, pinners) of the area holding gen, or None once it is reused."""
    for a in st.status()["areas"]:
        if a["generation"] == gen:
            return a["pins"], a["pinners"]
    return None


def fork_child(views, want, go_r, done_w, drop_first):
    """In the child: optionally drop the inherited views first (and say so),
    then wait for the parent's go and check every inherited view's bytes.
    Never returns."""
    code = 2
    try:
        if drop_first:
            del views[:]
            os.write(done_w, b"d")
        os.read(go_r, 1)
        got = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
        code = 0 if got == want or drop_first else 1
    except BaseException:  # noqa: BLE001 - any failure is the exit code
        code = 3
    os._exit(code)


def start_child(views, want, drop_first=False):
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.close(done_r)
        fork_child(views, want, go_r, done_w, drop_first)
    os.close(go_r)
    os.close(done_w)
    return pid, go_w, done_r


def finish_child(pid, go_w, done_r):
    os.write(go_w, b"g")
    os.close(go_w)
    os.close(done_r)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_child_views_survive_the_parent_dropping_them(shm_cfg):
    cfg = shm_cfg(swap_cap=4, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    _, counter = put_and_seal(st, 1, 0)
    gen = st.current()
    views = view_all(st, gen)
    want = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
    pid, go_w, done_r = start_child(views, want)
    try:
        # the child took its own pins before fork returned here
        assert area_pins(st, gen) == (2 * st.swap_cap, 2)
        del views
        assert area_pins(st, gen) == (st.swap_cap, 1)  # the child's, still there
        for _ in range(8):  # more seals than areas: gen's would be reused unpinned
            _, counter = put_and_seal(st, 1, counter)
        assert area_pins(st, gen) == (st.swap_cap, 1)
    finally:
        code = finish_child(pid, go_w, done_r)
    assert code == 0, "the child's inherited views changed under it"
    # the child is gone: its pins are pruned and the area goes back into use
    for _ in range(8):
        _, counter = put_and_seal(st, 1, counter)
    assert area_pins(st, gen) is None


def test_child_releases_drop_only_its_own_pins(shm_cfg):
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    put_and_seal(st, 2, 0)
    gen = st.current()
    views = view_all(st, gen)
    want = [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views]
    pid, go_w, done_r = start_child(views, want, drop_first=True)
    try:
        assert os.read(done_r, 1) == b"d"
        # the child dropped its inherited views: its pins went, the parent's stay
        assert area_pins(st, gen) == (st.swap_cap, 1)
        assert [a["pin_pid"] for a in st.status()["areas"] if a["pins"]] == [os.getpid()]
        assert [whlib.check_sample(i.numpy(), d.numpy()) for i, d in views] == want
    finally:
        code = finish_child(pid, go_w, done_r)
    assert code == 0
    del views
    assert area_pins(st, gen) == (0, 0)


def test_fork_without_views_takes_no_pins(shm_cfg):
    """A process holding copies, no views, forks as before: no pins appear."""
    cfg = shm_cfg(swap_cap=2, budget="64KiB")
    st = whlib.open_store(cfg)
    assert st.lead()
    put_and_seal(st, 3, 0)
    gen = st.current()
    _, _, _, arrs, _ = st.read_sample(gen, 0)
    copy = torch.from_dlpack(arrs[1])
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            code = 0 if area_pins(whlib.open_store(cfg), gen) == (0, 0) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert area_pins(st, gen) == (0, 0)
    whlib.check_sample(np.from_dlpack(arrs[0]), copy.numpy())
