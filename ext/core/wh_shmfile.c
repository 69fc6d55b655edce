/* Owner-checked files in shared memory; see wh_shmfile.h. */
#define _GNU_SOURCE
#include "wh_shmfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* What is wrong with the file st describes, or NULL if it may be used. */
static const char *wh__refusal(const struct stat *st, char *why, size_t cap, int *errnum) {
    *errnum = EPERM;
    if (S_ISLNK(st->st_mode)) {
        *errnum = ELOOP;
        return "is a symbolic link";
    }
    if (!S_ISREG(st->st_mode)) return "is not a regular file";
    if (st->st_uid != geteuid()) {
        snprintf(why, cap, "belongs to uid %u, not to this user (uid %u)", (unsigned)st->st_uid,
                 (unsigned)geteuid());
        return why;
    }
    if ((st->st_mode & 07777) != 0600) {
        snprintf(why, cap, "has mode %03o, not 0600", (unsigned)(st->st_mode & 07777));
        return why;
    }
    return NULL;
}

static int wh__refuse(const char *path, const char *why, int errnum, wh_err_t *err) {
    wh_err_set(err, WH_E_INVALID,
               "%s %s: refused (it was not made by this user's wirehead "
               "process; remove it, or ask whoever made it)",
               path, why);
    return -errnum;
}

bool wh_shmfile_check(int fd, const char *path, uint64_t min_size, uint64_t *size, wh_err_t *err) {
    struct stat st;
    char why[96];
    int errnum;
    if (fstat(fd, &st) != 0)
        return wh_err_set(err, WH_E_SYS, "%s: fstat: %s", path, strerror(errno));
    const char *bad = wh__refusal(&st, why, sizeof why, &errnum);
    if (bad) return wh__refuse(path, bad, errnum, err), false;
    if (st.st_size < 0 || (uint64_t)st.st_size < min_size)
        return wh_err_set(err, WH_E_INVALID,
                          "%s holds %lld bytes, %llu expected: it was "
                          "truncated or damaged",
                          path, (long long)st.st_size, (unsigned long long)min_size);
    if (size) *size = (uint64_t)st.st_size;
    return true;
}

/* 0 or the errno of a failed reservation (err set). */
static int wh__reserve(int fd, const char *path, uint64_t size, wh_err_t *err) {
    if (size > (uint64_t)INT64_MAX) {
        wh_err_set(err, WH_E_INVALID, "%s: size %llu too large", path, (unsigned long long)size);
        return EFBIG;
    }
    int r = posix_fallocate(fd, 0, (off_t)size);
    if (r == 0) return 0;
    struct statvfs vfs;
    unsigned long long avail = 0;
    if (fstatvfs(fd, &vfs) == 0) avail = (unsigned long long)vfs.f_bavail * vfs.f_frsize;
    /* a file size limit (EFBIG) leaves no room for this file either */
    wh_err_set(err, r == ENOSPC || r == EFBIG ? WH_E_NOSPACE : WH_E_SYS,
               "%s: cannot reserve %llu bytes in /dev/shm (%s; %llu bytes free there)", path,
               (unsigned long long)size, strerror(r), avail);
    return r;
}

bool wh_shmfile_reserve(int fd, const char *path, uint64_t size, wh_err_t *err) {
    return wh__reserve(fd, path, size, err) == 0;
}

/* A create or link of path that failed with errno e: -e, err saying why. */
static int wh__not_made(const char *path, int e, const char *what, wh_err_t *err) {
    struct stat st;
    char why[96];
    int errnum;
    const char *bad =
        e == EEXIST && lstat(path, &st) == 0 ? wh__refusal(&st, why, sizeof why, &errnum) : NULL;
    if (bad)
        wh__refuse(path, bad, errnum, err);
    else if (e == EEXIST)
        wh_err_set(err, WH_E_INVALID, "%s exists already (left by an earlier run?)", path);
    else
        wh_err_set(err, WH_E_SYS, "%s: cannot %s it: %s", path, what, strerror(e));
    return -e;
}

/* 0600 whatever the umask (openers refuse any other mode): 0 or -errno. */
static int wh__mode(int fd, const char *path, wh_err_t *err) {
    if (fchmod(fd, 0600) == 0) return 0;
    int e = errno;
    wh_err_set(err, WH_E_SYS, "%s: fchmod: %s", path, strerror(e));
    return -e;
}

int wh_shmfile_create_unnamed(const char *path, wh_err_t *err) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path || (size_t)(slash - path) >= sizeof dir) return -EOPNOTSUPP;
    memcpy(dir, path, (size_t)(slash - path));
    dir[slash - path] = 0;
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        if (e == EOPNOTSUPP || e == EISDIR || e == EINVAL) return -EOPNOTSUPP;
        return wh__not_made(path, e, "create", err);
    }
    int e = wh__mode(fd, path, err);
    if (e) close(fd);
    return e ? e : fd;
}

int wh_shmfile_link(int fd, const char *path, wh_err_t *err) {
    char self[64];
    snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, self, AT_FDCWD, path, AT_SYMLINK_FOLLOW) == 0) return 0;
    int e = errno;
    if (e == ENOENT && access(self, F_OK) != 0) return -EOPNOTSUPP; /* no /proc */
    return wh__not_made(path, e, "name", err);
}

int wh_shmfile_create(const char *path, uint64_t size, wh_err_t *err) {
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return wh__not_made(path, errno, "create", err);
    int m = wh__mode(fd, path, err);
    if (m) {
        unlink(path);
        close(fd);
        return m;
    }
    int e = size ? wh__reserve(fd, path, size, err) : 0;
    if (e) {
        unlink(path); /* ours: made just now by O_EXCL */
        close(fd);
        return -e;
    }
    return fd;
}

int wh_shmfile_open(const char *path, uint64_t min_size, wh_err_t *err) {
    /* checked before the open too, so a FIFO or a device is never opened */
    struct stat pre;
    char why[96];
    int errnum;
    if (lstat(path, &pre) != 0) {
        int e = errno;
        if (e == ENOENT)
            wh_err_set(err, WH_E_NOTFOUND, "%s does not exist", path);
        else
            wh_err_set(err, WH_E_SYS, "%s: %s", path, strerror(e));
        return -e;
    }
    const char *bad = wh__refusal(&pre, why, sizeof why, &errnum);
    if (bad) return wh__refuse(path, bad, errnum, err);
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) return wh__refuse(path, "is a symbolic link", ELOOP, err);
        if (e == ENOENT)
            wh_err_set(err, WH_E_NOTFOUND, "%s does not exist", path);
        else
            wh_err_set(err, WH_E_SYS, "%s: cannot open it: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (!wh_shmfile_check(fd, path, 0, NULL, err)) {
        close(fd);
        return -(err && err->code == WH_E_SYS ? EIO : EPERM);
    }
    if (fstat(fd, &st) != 0 || st.st_dev != pre.st_dev || st.st_ino != pre.st_ino) {
        close(fd); /* replaced between the two looks: the caller may try again */
        wh_err_set(err, WH_E_NOTFOUND, "%s was replaced while being opened", path);
        return -ENOENT;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < min_size) {
        close(fd);
        wh_err_set(err, WH_E_INVALID,
                   "%s holds %lld bytes, %llu expected: it was truncated or "
                   "damaged",
                   path, (long long)st.st_size, (unsigned long long)min_size);
        return -EFBIG;
    }
    /* O_NONBLOCK served the open only */
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        wh_err_set(err, WH_E_SYS, "%s: fcntl: %s", path, strerror(e));
        return -e;
    }
    return fd;
}
