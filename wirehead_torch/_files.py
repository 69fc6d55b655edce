"""Files the package writes outside /dev/shm (shards, index.json, job
records) and the files it reads by a path it was given: created exclusively,
never through a link, put in place without replacing what another process
planted there, and read only when regular files.

Every function takes ``error``, the exception class its caller reports with
(ShardError, ConfigError, ...); the message names the path. ``dir_fd``: the
directory path's dirname names, opened once by the caller; the file is then
reached as path's last component relative to that fd, never through the
path again (a directory renamed away and replaced by a link meanwhile
changes nothing)."""
import ctypes
import errno
import os
import secrets
import stat

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a directory"),
         (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
         (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISREG, "a file"))


def kind(mode):
    """What a st_mode is, in words."""
    return next((k for test, k in KINDS if test(mode)), "not a regular file")


def _at(path, dir_fd):
    return path if dir_fd is None else os.path.basename(path)


def _lstat(path, dir_fd=None):
    return os.stat(_at(path, dir_fd), dir_fd=dir_fd, follow_symlinks=False)


def there(path, dir_fd=None):
    try:
        return kind(_lstat(path, dir_fd).st_mode)
    except OSError:
        return "a file"


def identity(fd):
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def named(path, dir_fd=None):
    """(dev, ino) of what path names itself (a link is not followed); None
    when nothing is there."""
    try:
        st = _lstat(path, dir_fd)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def create(path, error, mode=0o644, dir_fd=None):
    """A write fd of a new regular file at path. O_EXCL|O_NOFOLLOW: a file
    or link already at the name is refused, never written or followed."""
    try:
        return os.open(_at(path, dir_fd), _CREATE, mode, dir_fd=dir_fd)
    except FileExistsError:
        raise error(f"{path}: {there(path, dir_fd)} is already there, not made by this process; "
                    f"refusing to write through or over it (remove it)") from None
    except OSError as e:
        raise error(f"{path}: cannot create: {e.strerror}") from None


def remove_own(path, ident, dir_fd=None):
    """Unlinks path only while it still names the file ident is of."""
    if ident is not None and named(path, dir_fd) == ident:
        try:
            os.unlink(_at(path, dir_fd), dir_fd=dir_fd)
        except FileNotFoundError:
            pass


def _libc_renameat2():
    try:
        f = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    f.restype = ctypes.c_int
    return f


_renameat2 = _libc_renameat2()


def _rename_noreplace(src, dst, dir_fd=None):
    """src renamed to dst, failing with FileExistsError when anything (a
    dangling link too) is at dst. Python has no renameat2 binding, so it is
    called through ctypes (glibc >= 2.28); where the C library or the file
    system lacks it, link + unlink does the same: link() never replaces
    either, it only leaves both names for a moment."""
    at = _AT_FDCWD if dir_fd is None else dir_fd
    src, dst = _at(src, dir_fd), _at(dst, dir_fd)
    if _renameat2 is not None:
        if _renameat2(at, os.fsencode(src), at, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), dst)
    os.link(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    os.unlink(src, dir_fd=dir_fd)


def put_in_place(fd, tmp, final, error, replaces=None, dir_fd=None):
    """Renames tmp, the file open as fd, to final; returns final's (dev,
    ino). replaces=None: nothing may be at final (renameat2 with
    RENAME_NOREPLACE); replaces=(dev, ino): only that file, put there
    earlier by the caller, is replaced; replaces="file": any regular
    file of this user (a record rewritten by each run). Anything else at
    final (a link, a planted file, another user's) is refused naming it,
    and tmp is removed. Afterwards final must be fd's file: a tmp swapped
    for another after it was created is refused too."""
    mine = identity(fd)
    try:
        if replaces is None:
            try:
                _rename_noreplace(tmp, final, dir_fd)
            except FileExistsError:
                raise error(f"{final}: {there(final, dir_fd)} is already there, not made by "
                            f"this process; refusing to replace it (remove it)") from None
        else:
            try:
                at = _lstat(final, dir_fd)
            except FileNotFoundError:
                at = None
            if at is not None and ((at.st_dev, at.st_ino) != replaces if replaces != "file" else
                                   not stat.S_ISREG(at.st_mode) or at.st_uid != os.geteuid()):
                what = (f"a file of uid {at.st_uid}" if stat.S_ISREG(at.st_mode) and
                        at.st_uid != os.geteuid() else kind(at.st_mode))
                raise error(f"{final}: {what} is there that this process did not "
                            f"put there; refusing to replace it (remove it)")
            try:
                os.rename(_at(tmp, dir_fd), _at(final, dir_fd), src_dir_fd=dir_fd,
                          dst_dir_fd=dir_fd)
            except PermissionError as e:  # planted meanwhile by another user (sticky dir)
                raise error(f"{final}: cannot replace it ({e.strerror}): another user's file "
                            f"is there; remove it") from None
    except BaseException:
        remove_own(tmp, mine, dir_fd)
        raise
    if named(final, dir_fd) != mine:
        # the swapped-in name, inside the same directory
        remove_own(final, named(final, dir_fd), dir_fd)
        raise error(f"{tmp}: replaced by another file or link while this process wrote it; "
                    f"refusing it")
    return mine


def write_file(final, data, error, replaces=None, mode=0o644, sync=False, tmp=None,
               dir_fd=None):
    """data (bytes) written to final through a temporary beside it (tmp,
    default .NAME.PID.RANDOM.tmp: a killed writer's leftover never blocks
    the next), created exclusively, then put_in_place; returns final's
    (dev, ino)."""
    if tmp is None:
        d, base = os.path.split(final)
        tmp = os.path.join(d, f".{base}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = create(tmp, error, mode, dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if sync:
            os.fsync(fd)
        return put_in_place(fd, tmp, final, error, replaces, dir_fd)
    except BaseException:
        remove_own(tmp, identity(fd), dir_fd)
        raise
    finally:
        os.close(fd)


def open_regular(path, error, what="file"):
    """A read fd of path, which must be a regular file: checked before the
    open (a clear error) and on the open fd (what was opened). O_NONBLOCK:
    a FIFO's open never waits for a writer. A link to a regular file is
    read (datasets are often laid out by links; reading writes nothing, and
    the check on the fd is of the file read). Errors are error(reason, path)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise error(f"cannot open: {e.strerror}", path) from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"a {what} must be a regular file, this is {kind(st.st_mode)}", path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        raise error(f"cannot open: {e.strerror}", path) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"a {what} must be a regular file, this is {kind(st.st_mode)}", path)
    os.set_blocking(fd, True)
    return fd
