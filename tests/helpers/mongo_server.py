"""The in-memory MongoDB test server (mongo-java-server), for pytest.

    from mongo_server import MongoTestServer
    with MongoTestServer() as srv:
        uri = srv.uri          # mongodb://127.0.0.1:PORT
        srv.restart()          # same port, empty database
        srv.kill()             # SIGKILL, for fault tests; start() again later

The jars come from tests/mongo/fetch.sh (run here if they are missing). The
server is a child process holding a pipe on its stdin, so it also exits when
the test process dies.
"""

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SOURCE = os.path.join(REPO, "tests", "mongo", "MongoTestServer.java")
FETCH = os.path.join(REPO, "tests", "mongo", "fetch.sh")
DEFAULT_JARS = os.path.join(REPO, ".deps", "mongo-java-server")


class MongoServerError(RuntimeError):
    pass


def jar_dir():
    """Directory holding the server jars, fetched on first use."""
    d = os.environ.get("WIREHEAD_MONGO_JARS", DEFAULT_JARS)
    if not os.path.isdir(d) or not any(n.endswith(".jar") for n in os.listdir(d)):
        subprocess.run(["sh", FETCH, d], check=True)
    return d


def _java():
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    java = shutil.which("java")
    if java is None:
        raise MongoServerError("java not found: the MongoDB test server needs Java 11+")
    return java


class MongoTestServer:
    """One mongo-java-server process on 127.0.0.1.

    port=0 picks a free port at the first start; restart() keeps it.
    start_timeout bounds the wait for the LISTENING line (the JVM compiles
    the single-file source first, about 2 s)."""

    def __init__(self, port=0, start_timeout=60.0, log_path=None):
        self.port = int(port)
        self.start_timeout = float(start_timeout)
        self._log_path = log_path
        self._own_log = log_path is None
        self._log = None
        self.proc = None
        self.starts = 0

    # -- lifecycle ---------------------------------------------------------

    @property
    def uri(self):
        if self.port == 0:
            raise MongoServerError("server not started")
        return "mongodb://127.0.0.1:%d" % self.port

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self):
        return None if self.proc is None else self.proc.pid

    def start(self):
        if self.running:
            raise MongoServerError("server already running on port %d" % self.port)
        if self._log_path is None:
            fd, self._log_path = tempfile.mkstemp(prefix="wirehead-mongo-", suffix=".log")
            os.close(fd)
        self._log = open(self._log_path, "ab")
        cmd = [_java(), "-XX:+UseSerialGC",
               "-cp", os.path.join(jar_dir(), "*"), SOURCE, str(self.port)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, close_fds=True)
        try:
            port = self._read_listening()
        except BaseException:
            self._terminate(self.proc)
            self.proc = None
            raise
        if self.port not in (0, port):
            self._terminate(self.proc)
            self.proc = None
            raise MongoServerError("server bound %d, asked for %d" % (port, self.port))
        self.port = port
        self.starts += 1
        return self

    def _read_listening(self):
        """Reads stdout until the LISTENING line, the process exits, or the
        deadline passes."""
        deadline = time.monotonic() + self.start_timeout
        out = self.proc.stdout
        buf = b""
        with selectors.DefaultSelector() as sel:
            sel.register(out, selectors.EVENT_READ)
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MongoServerError("test server did not start within %.0f s%s"
                                           % (self.start_timeout, self._log_tail()))
                if not sel.select(left):
                    continue
                data = os.read(out.fileno(), 4096)
                if not data:
                    self.proc.wait(timeout=10)
                    raise MongoServerError("test server exited with %s before listening%s"
                                           % (self.proc.returncode, self._log_tail()))
                buf += data
        line = buf.split(b"\n", 1)[0].decode("ascii", "replace").strip()
        parts = line.split()
        if len(parts) != 2 or parts[0] != "LISTENING" or not parts[1].isdigit():
            raise MongoServerError("unexpected line from test server: %r%s"
                                   % (line, self._log_tail()))
        return int(parts[1])

    def _log_tail(self, n=2000):
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                tail = f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""
        return ("\n--- server log ---\n" + tail) if tail else ""

    @staticmethod
    def _terminate(proc, sig=signal.SIGTERM, timeout=20.0):
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        for f in (proc.stdin, proc.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass

    def stop(self):
        """SIGTERM and wait; the database is gone afterwards."""
        if self.proc is not None:
            self._terminate(self.proc)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self):
        """SIGKILL and wait (a crashed server)."""
        if self.proc is not None:
            self._terminate(self.proc, signal.SIGKILL)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def restart(self):
        """Stops and starts again on the same port, empty."""
        self.stop()
        return self.start()

    def close(self):
        self.stop()
        if self._own_log and self._log_path is not None:
            try:
                os.unlink(self._log_path)
            except OSError:
                pass
            self._log_path = None

    def __enter__(self):
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def start_server(**kw):
    """A started MongoTestServer (caller stops it)."""
    return MongoTestServer(**kw).start()


def stop_server(server):
    server.close()


# -- raw commands, for tests that inspect or damage what the store wrote ----
#
# The package speaks to MongoDB only through its C core; tests that need to
# look at collections directly (or write bad data on purpose) use libmongoc
# through ctypes rather than another driver.

import base64 as _base64  # noqa: E402 (with the code that uses it)
import ctypes as _ctypes  # noqa: E402
import json as _json  # noqa: E402

_libs = None


def _load():
    global _libs
    if _libs is None:
        bson = _ctypes.CDLL("libbson-1.0.so.0")
        mongoc = _ctypes.CDLL("libmongoc-1.0.so.0")
        bson.bson_new_from_json.restype = _ctypes.c_void_p
        bson.bson_new_from_json.argtypes = [_ctypes.c_char_p, _ctypes.c_ssize_t, _ctypes.c_void_p]
        bson.bson_as_relaxed_extended_json.restype = _ctypes.c_void_p
        bson.bson_as_relaxed_extended_json.argtypes = [_ctypes.c_void_p, _ctypes.c_void_p]
        bson.bson_free.argtypes = [_ctypes.c_void_p]
        bson.bson_destroy.argtypes = [_ctypes.c_void_p]
        mongoc.mongoc_init.argtypes = []
        mongoc.mongoc_client_new.restype = _ctypes.c_void_p
        mongoc.mongoc_client_new.argtypes = [_ctypes.c_char_p]
        mongoc.mongoc_client_destroy.argtypes = [_ctypes.c_void_p]
        mongoc.mongoc_client_set_error_api.argtypes = [_ctypes.c_void_p, _ctypes.c_int32]
        mongoc.mongoc_client_command_simple.restype = _ctypes.c_bool
        mongoc.mongoc_client_command_simple.argtypes = [
            _ctypes.c_void_p, _ctypes.c_char_p, _ctypes.c_void_p, _ctypes.c_void_p,
            _ctypes.c_void_p, _ctypes.c_void_p]
        mongoc.mongoc_init()
        _libs = (bson, mongoc)
    return _libs


class _BsonError(_ctypes.Structure):
    _fields_ = [("domain", _ctypes.c_uint32), ("code", _ctypes.c_uint32),
                ("message", _ctypes.c_char * 504)]


def binary(data):
    """Extended-JSON form of a BSON binary value."""
    return {"$binary": {"base64": _base64.b64encode(bytes(data)).decode(), "subType": "00"}}


def unbinary(value):
    """bytes from the extended-JSON form of a BSON binary value."""
    return _base64.b64decode(value["$binary"]["base64"])


class RawClient:
    """Runs database commands given as dicts (relaxed extended JSON) and
    returns the replies as dicts. For tests only."""

    def __init__(self, uri):
        bson, mongoc = _load()
        self._bson, self._mongoc = bson, mongoc
        self._client = mongoc.mongoc_client_new(uri.encode())
        if not self._client:
            raise MongoServerError("invalid MongoDB URI for the raw client")
        mongoc.mongoc_client_set_error_api(self._client, 2)

    def command(self, db, cmd):
        err = _BsonError()
        text = _json.dumps(cmd).encode()
        doc = self._bson.bson_new_from_json(text, len(text), _ctypes.byref(err))
        if not doc:
            raise MongoServerError("bad command JSON: %s" % err.message.decode())
        # bson_t is a 128-byte struct aligned to 128: carve an aligned one
        raw = _ctypes.create_string_buffer(512)
        reply = (_ctypes.addressof(raw) + 127) & ~127
        try:
            ok = self._mongoc.mongoc_client_command_simple(
                self._client, db.encode(), doc, None, _ctypes.c_void_p(reply), _ctypes.byref(err))
            js = self._bson.bson_as_relaxed_extended_json(_ctypes.c_void_p(reply), None)
            out = _json.loads(_ctypes.string_at(js).decode()) if js else {}
            self._bson.bson_free(js)
            self._bson.bson_destroy(_ctypes.c_void_p(reply))
        finally:
            self._bson.bson_destroy(doc)
        if not ok:
            raise MongoServerError("command %s failed: %s (code %d)"
                                   % (next(iter(cmd)), err.message.decode(), err.code))
        return out

    def find(self, db, coll, flt=None, projection=None):
        cmd = {"find": coll, "filter": flt or {}, "batchSize": 100000}
        if projection:
            cmd["projection"] = projection
        return self.command(db, cmd)["cursor"]["firstBatch"]

    def update(self, db, coll, flt, update):
        r = self.command(db, {"update": coll, "updates": [{"q": flt, "u": update}]})
        return r.get("nModified", 0)

    def collections(self, db):
        r = self.command(db, {"listCollections": 1, "nameOnly": True})
        return sorted(c["name"] for c in r["cursor"]["firstBatch"])

    def close(self):
        if self._client:
            self._mongoc.mongoc_client_destroy(self._client)
            self._client = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def main(argv):
    """`make mongo-server` (or `python tests/helpers/mongo_server.py [PORT
    [DBNAME]]`): serves an empty, in-memory database on loopback until
    Ctrl-C, to try the MongoDB store on one machine (it keeps nothing and is
    not a production server), and prints the line that points wirehead_torch
    at it. PORT 0 picks a free one."""
    import socket
    import sys
    if len(argv) > 2 or (argv and not argv[0].isdigit()):
        sys.exit("usage: mongo_server.py [PORT [DBNAME]]  (PORT 0: a free one)")
    port = int(argv[0]) if argv else 0
    db = argv[1] if len(argv) > 1 else "brains"
    if port:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                sys.exit(f"port {port} is in use (a MongoDB server already?): "
                         f"`make mongo-server MONGO_PORT=0` picks a free port")
    try:
        srv = MongoTestServer(port=port).start()
    except MongoServerError as e:
        sys.exit(f"the MongoDB test server did not start: {e}")
    print(f"in-memory MongoDB test server on {srv.uri} (Ctrl-C ends it, and its data); "
          f"to use it from another shell:\n"
          f"export WIREHEAD_STORE={srv.uri}/{db}", flush=True)
    try:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while srv.proc.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        srv.close()


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
