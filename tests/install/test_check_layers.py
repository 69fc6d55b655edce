"""`make lint`'s layer checker (tests/helpers/check_layers.py) on a small
ext/ tree of its own: files of one folder calling each other round are a
circle whatever header they share; a call up a layer fails with no way to
allow it; a URI scheme spelled in a string outside the scheme table and its
backend's folder fails (comments are free); a file past MAX_LINES fails."""

import check_layers as cl
import pytest

TABLE = """static const struct { const char *prefix; const void *ops; } t[] = {
    {"shm://", &wh_shm_ops},
    {"mongodb://", &wh_mongo_ops},
};
"""


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """make(files, calls): an ext/ tree of files {"folder/x.c": text} whose
    objects call [(caller, symbol, callee)] (file names without .c)."""
    def make(files, calls=()):
        for rel, text in files.items():
            p = tmp_path / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        monkeypatch.setattr(cl, "EXT", str(tmp_path))
        monkeypatch.setattr(cl, "_calls", lambda objdir: sorted(calls))
        monkeypatch.setattr(cl, "LONG_OK", {})
    return make


def test_files_of_one_folder_calling_round_are_a_circle(tree, monkeypatch, capsys):
    tree({"shm/wh_shm_int.h": "", "shm/a.c": '#include "wh_shm_int.h"\n',
          "shm/b.c": '#include "wh_shm_int.h"\n', "shm/c.c": '#include "wh_shm_int.h"\n',
          "store/wh_scheme.c": TABLE, "mongo/m.c": ""},
         [("shm/a", "b1", "shm/b"), ("shm/b", "c1", "shm/c"), ("shm/c", "a1", "shm/a"),
          ("store/wh_scheme", "wh_shm_ops", "shm/a"), ("store/wh_scheme", "wh_mongo_ops", "mongo/m")])
    assert cl.circles(cl.graph("objs")) == [["shm/a", "shm/b", "shm/c"]]
    monkeypatch.setattr("sys.argv", ["check_layers.py", "objs"])
    with pytest.raises(SystemExit) as done:
        cl.main()
    out, err = capsys.readouterr()
    assert done.value.code == 1
    assert "every call and include runs down" in out and "schemes spelled only" in out
    assert "ext/ files that call each other in a circle: shm/a, shm/b, shm/c" in err


def test_files_of_one_folder_calling_down_are_no_circle(tree):
    tree({"shm/wh_shm_int.h": "", "shm/a.c": "", "shm/b.c": "", "shm/c.c": ""},
         [("shm/a", "b1", "shm/b"), ("shm/b", "c1", "shm/c"), ("shm/a", "c2", "shm/c")])
    assert cl.circles(cl.graph("objs")) == []


def test_a_call_or_include_up_a_layer_fails(tree):
    tree({"backend/wh_backend.h": "", "store/wh_store.h": "", "store/s.c": "",
          "shm/a.c": '#include "wh_backend.h"\n#include "wh_store.h"\n', "mongo/m.c": ""},
         [("shm/a", "wh_store_here", "store/s"), ("shm/a", "wh_mongo_x", "mongo/m")])
    bad = cl.layer_errors("objs")
    assert bad == ["ext/shm/a.c calls wh_mongo_x in ext/mongo/m.c (a layer beside it)",
                   "ext/shm/a.c calls wh_store_here in ext/store/s.c (a higher layer)",
                   "ext/shm/a.c includes wh_store.h in ext/store/ (a higher layer)"]
    assert not hasattr(cl, "ALLOW")


def test_a_scheme_is_spelled_only_in_the_table_and_its_backend(tree):
    tree({"store/wh_scheme.c": TABLE,
          "shm/s.c": 'const ops wh_shm_ops = {.name = "shm"};\nconst char *u = "shm://x";\n',
          "mongo/m.c": 'const ops wh_mongo_ops = {.name = "mongodb"};\n',
          "read/r.c": '/* a mongodb:// source, "shm://" in a comment */\n'
                      'bool f(const char *u) { return !strncmp(u, "mongodb://", 10); }\n'
                      'const char *n = "shm", *ok = "shm store", *c = \'"\';\n',
          "shm/t.c": 'const char *hint = "or use a mongodb:// store";\n'},
         [("store/wh_scheme", "wh_shm_ops", "shm/s"), ("store/wh_scheme", "wh_mongo_ops", "mongo/m")])
    bad = cl.scheme_errors("objs")
    assert [b.split(" (in ")[0] for b in bad] == [
        "ext/read/r.c spells 'mongodb://'", "ext/read/r.c spells 'shm'",
        "ext/shm/t.c spells 'mongodb://'"]


def test_a_long_file_fails_and_an_unneeded_exception_too(tree, monkeypatch):
    tree({"core/long.c": "x;\n" * (cl.MAX_LINES + 1), "core/short.c": "x;\n" * cl.MAX_LINES})
    assert cl.size_errors() == [f"ext/core/long.c has {cl.MAX_LINES + 1} lines, more than "
                                f"{cl.MAX_LINES}: split it by concern"]
    monkeypatch.setattr(cl, "LONG_OK", {"core/long.c": "why", "core/short.c": "why"})
    assert cl.size_errors() == ["LONG_OK lets ext/core/short.c be long, which it is no longer: "
                                "drop the entry"]
