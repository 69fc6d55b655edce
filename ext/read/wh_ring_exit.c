/* A DataLoader worker ends with the process iterating its DataLoader
 * (wh_ring_exit_with, wh_ring.h): a death signal of its own whose handler
 * removes the dead main process's ring files first. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "wh_ring.h"

/* Read by the SIGTERM handler: only async-signal-safe calls there. */
static struct {
    pid_t main_pid, parent;
    int dir;
    char prefix[96];
    size_t prefix_len;
} wh__exit = {.dir = -1};

/* The main process's own ring files, removed on its SIGTERM
 * (wh_ring_term_removes); read by that handler. */
static struct {
    pid_t pid;
    int dir;
    char prefix[96];
    size_t prefix_len;
} wh__own = {.dir = -1};

static bool wh__main_gone(void) {
    if (wh__exit.parent) return getppid() != wh__exit.parent;
    return kill(wh__exit.main_pid, 0) != 0 && errno == ESRCH;
}

#ifdef __linux__
/* One pass over dir: this user's regular files named prefix* removed
 * (getdents64, fstatat, unlinkat: syscalls, safe in a handler); true when
 * one was, as removing may skip entries of the listing. */
static bool wh__remove_pass(int dir, const char *prefix, size_t prefix_len) {
    static char buf[8192] __attribute__((aligned(8)));
    bool removed = false;
    if (lseek(dir, 0, SEEK_SET) < 0) return false;
    for (;;) {
        long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
        if (n <= 0) return removed;
        for (long at = 0; at < n;) {
            /* struct linux_dirent64: ino, off (8 bytes each), reclen, type, name */
            unsigned short reclen;
            memcpy(&reclen, buf + at + 16, sizeof reclen);
            const char *name = buf + at + 19;
            struct stat st;
            if (strncmp(name, prefix, prefix_len) == 0 &&
                fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
                st.st_uid == geteuid() && unlinkat(dir, name, 0) == 0)
                removed = true;
            at += reclen;
        }
    }
}
#endif

/* The death signal is one of its own, not SIGTERM: torch ends a stuck
 * worker with SIGTERM, and the kernel also sends it when only the thread
 * that started the worker exits (the worker then belongs to a sibling
 * thread of the same main process and keeps running). */
#define WH__DEATH_SIG (SIGRTMIN + 3)

static void wh__exit_handler(int sig) {
    int saved = errno;
    (void)sig;
    /* a forkserver's child: its server ends only after the main process */
    if (wh__exit.parent && !wh__main_gone()) {
        errno = saved;
        return; /* a thread of the main process ended, not the process */
    }
#ifdef __linux__
    for (int i = 0; i < 8 && wh__remove_pass(wh__exit.dir, wh__exit.prefix, wh__exit.prefix_len);
         i++) {
    }
#endif
    signal(SIGTERM, SIG_DFL); /* the worker ends as torch's terminate() ends it */
    raise(SIGTERM);
    errno = saved;
}

/* SIGTERM from the main process (torch's terminate()) or after it died
 * ends the worker as before. One from another process while the main
 * process lives (a batch system or `kill -TERM -PGID` signalling every
 * process) is ignored: the worker ends with the main process, by the death
 * signal, whose handler removes the ring files that dying here would
 * leave. */
static void wh__term_handler(int sig, siginfo_t *info, void *ctx) {
    int saved = errno;
    (void)ctx;
    if (wh__main_gone()) {
        wh__exit_handler(WH__DEATH_SIG); /* removes the files; SIGTERM ends the worker */
    } else if (info->si_code != SI_USER || info->si_pid == wh__exit.main_pid) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
    errno = saved;
}

bool wh_ring_exit_with(int64_t main_pid, int64_t parent, const char *dir, const char *prefix,
                       wh_err_t *err) {
#ifdef __linux__
    if (main_pid <= 0 || parent < 0)
        return wh_err_set(err, WH_E_INVALID, "exit_with: main pid %lld, parent %lld",
                          (long long)main_pid, (long long)parent);
    if (wh__exit.dir >= 0) return true; /* once per process */
    size_t len = strlen(prefix);
    if (len == 0 || len >= sizeof wh__exit.prefix)
        return wh_err_set(err, WH_E_INVALID, "exit_with: prefix of %zu bytes", len);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return wh_err_set(err, WH_E_SYS, "exit_with: %s: %s", dir, strerror(errno));
    wh__exit.main_pid = (pid_t)main_pid;
    wh__exit.parent = (pid_t)parent;
    memcpy(wh__exit.prefix, prefix, len + 1);
    wh__exit.prefix_len = len;
    wh__exit.dir = fd;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = wh__exit_handler;
    sigemptyset(&sa.sa_mask);
    struct sigaction term;
    memset(&term, 0, sizeof term);
    term.sa_sigaction = wh__term_handler;
    term.sa_flags = SA_SIGINFO;
    sigemptyset(&term.sa_mask);
    if (sigaction(WH__DEATH_SIG, &sa, NULL) != 0 || sigaction(SIGTERM, &term, NULL) != 0 ||
        prctl(PR_SET_PDEATHSIG, WH__DEATH_SIG) != 0)
        return wh_err_set(err, WH_E_SYS, "exit_with: %s", strerror(errno));
    /* the main process may have died before the death signal was asked for */
    if (wh__main_gone()) raise(WH__DEATH_SIG);
    return true;
#else
    (void)main_pid, (void)parent, (void)dir, (void)prefix;
    return wh_err_set(err, WH_E_SYS, "exit_with: Linux only");
#endif
}

/* The main process's SIGTERM (the default's stand-in): its ring files go,
 * then SIGTERM ends it as the default would. A child forked before it set
 * up its own signals dies as by default: the files are not its own. */
static void wh__own_term(int sig) {
    int saved = errno;
#ifdef __linux__
    if (getpid() == wh__own.pid) {
        for (int i = 0; i < 8 && wh__remove_pass(wh__own.dir, wh__own.prefix, wh__own.prefix_len);
             i++) {
        }
    }
#endif
    signal(sig, SIG_DFL);
    raise(sig);
    errno = saved;
}

bool wh_ring_term_removes(const char *dir, const char *prefix, bool *installed, wh_err_t *err) {
    *installed = false;
#ifdef __linux__
    if (wh__own.dir >= 0 && wh__own.pid == getpid()) {
        *installed = true;
        return true; /* once per process */
    }
    size_t len = strlen(prefix);
    if (len == 0 || len >= sizeof wh__own.prefix)
        return wh_err_set(err, WH_E_INVALID, "term_removes: prefix of %zu bytes", len);
    struct sigaction now;
    if (sigaction(SIGTERM, NULL, &now) != 0)
        return wh_err_set(err, WH_E_SYS, "term_removes: %s", strerror(errno));
    if ((now.sa_flags & SA_SIGINFO) || now.sa_handler != SIG_DFL)
        return true; /* not ours to take */
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return wh_err_set(err, WH_E_SYS, "term_removes: %s: %s", dir, strerror(errno));
    if (wh__own.dir >= 0) close(wh__own.dir); /* a forked child's copy of its parent's */
    memcpy(wh__own.prefix, prefix, len + 1);
    wh__own.prefix_len = len;
    wh__own.dir = fd;
    wh__own.pid = getpid();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = wh__own_term;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, &sa, NULL) != 0)
        return wh_err_set(err, WH_E_SYS, "term_removes: %s", strerror(errno));
    *installed = true;
    return true;
#else
    (void)dir, (void)prefix;
    return wh_err_set(err, WH_E_SYS, "term_removes: Linux only");
#endif
}
