"""Smoke test of the built wheel, run by tests/helpers/wheel_smoke.sh in a fresh venv
(no torch) inside a mount namespace where the system's libmongoc, libbson and
libxxhash are hidden: the wheel must carry its own copies."""
import ctypes
import os
import sys

import numpy as np

HIDDEN = ["libmongoc-1.0.so.0", "libbson-1.0.so.0", "libxxhash.so.0"]


def main():
    for lib in HIDDEN:  # the check itself must be able to fail
        try:
            ctypes.CDLL(lib)
        except OSError:
            continue
        sys.exit(f"wheel smoke: the system's {lib} is still loadable; nothing was hidden")

    import wirehead_torch as wt
    from wirehead_torch import _C
    from wirehead_torch._store_args import store_kwargs
    from wirehead_torch.config import resolve
    assert "site-packages" in wt.__file__, wt.__file__
    assert "torch" not in sys.modules, "the generator side imported torch"
    assert _C.FAULT_HOOKS == 0, "the wheel carries the test builds' fault-injection points"

    maps = open("/proc/self/maps").read()
    for lib in ("libmongoc", "libbson", "libxxhash"):
        paths = {ln.split()[-1] for ln in maps.splitlines() if lib in ln}
        assert paths and all("wirehead_torch.libs" in p for p in paths), (lib, paths)

    cfg = {"STORE": f"shm://wheelsmoke{os.getpid()}", "SWAP_CAP": 4, "SAMPLE": ["id", "data"],
           "BYTE_BUDGET": "1MiB", "SELF_SEAL": False}  # the manager below seals
    items = [(np.array([7, i], dtype=np.int64), np.arange(64, dtype=np.float32) + i)
             for i in range(4)]
    try:
        wt.WireheadGenerator(iter(items), config=cfg).run()
        assert wt.WireheadManager(config=cfg).run(max_swaps=1) == 1
        store = _C.Store(**store_kwargs(resolve(cfg)))
        gen = store.current()
        got = sorted(int(np.from_dlpack(store.read(gen, i)[0])[1]) for i in range(4))
        assert got == [0, 1, 2, 3], got
        for i in range(4):
            ident, data = (np.from_dlpack(a) for a in store.read(gen, i))
            assert np.array_equal(data, np.arange(64, dtype=np.float32) + ident[1])
        store.close()
    finally:
        wt.clean(cfg)

    # libmongoc itself runs: an unreachable server is reported, not a load error
    bad = {"STORE": "mongodb://127.0.0.1:1/wheelsmoke", "SWAP_CAP": 4, "SAMPLE": ["x"],
           "CONNECT_TIMEOUT": 1}
    try:
        _C.Store(**store_kwargs(resolve(bad)))
    except Exception as e:  # noqa: BLE001 - any store error is fine; a crash is not
        msg = str(e)
        assert "127.0.0.1:1" in msg or "unreachable" in msg.lower() or "connect" in msg.lower(), msg
    else:
        sys.exit("wheel smoke: a store on a closed port opened")
    print("wheel smoke: ok (bundled libmongoc, libbson, libxxhash; shm round trip; mongo client)")


if __name__ == "__main__":
    main()
