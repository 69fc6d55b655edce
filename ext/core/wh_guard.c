/* The SIGBUS guard of shared mappings (wh_guard.h). The registry is a list
 * of fixed chunks that only grows, so the handler reads it without a lock;
 * entries are claimed and freed under wh__mu. */
#define _GNU_SOURCE
#include "wh_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define WH__GUARD_CHUNK 64

typedef struct {
    uintptr_t base; /* 0: free; published last (release) */
    size_t len;     /* page-rounded */
    int prot;
    int shrunk;
    int fd;        /* the file (our own descriptor), for wh_guard_cut; -1: none */
    uint64_t need; /* bytes of the file the mapping shows */
} wh__guard_ent_t;

typedef struct wh__guard_chunk {
    struct wh__guard_chunk *next;
    wh__guard_ent_t ent[WH__GUARD_CHUNK];
} wh__guard_chunk_t;

static pthread_mutex_t wh__mu = PTHREAD_MUTEX_INITIALIZER;
static wh__guard_chunk_t *wh__chunks;
static struct sigaction wh__prev; /* the handler the guard chains to */
static uintptr_t wh__page = 4096;
static int wh__chaining;
static int wh__installed; /* the guard was installed once in this process */

static void wh__on_bus(int sig, siginfo_t *si, void *uc);

static bool wh__is_mine(const struct sigaction *sa) {
    return (sa->sa_flags & SA_SIGINFO) && sa->sa_sigaction == wh__on_bus;
}

/* A SIGBUS this guard does not own goes where it would have gone without
 * the guard. A handler installed before it (torch's, faulthandler's,
 * Python's, which notes the signal for the interpreter) is called as a
 * function, with its sa_mask blocked and its SA_SIGINFO form, for a fault
 * and for a signal sent by kill or raise (no address) alike. Ignored
 * before (SIG_IGN): a sent one is dropped; a fault cannot be ignored (the
 * access would fault again for ever), so it gets the default, as the
 * kernel gives it. The default (or a loop back here): the process dies of
 * SIGBUS as it would have. */
static void wh__chain(int sig, siginfo_t *si, void *uc) {
    struct sigaction p = wh__prev;
    bool info = p.sa_flags & SA_SIGINFO, sent = !si || si->si_code <= 0;
    /* SIG_DFL and SIG_IGN are what sa_handler holds, whatever the flags */
    bool ign = p.sa_handler == SIG_IGN, fn = !ign && p.sa_handler != SIG_DFL;
    if (ign && sent) return;
    if (fn && !wh__is_mine(&p) && !__atomic_exchange_n(&wh__chaining, 1, __ATOMIC_ACQ_REL)) {
        sigset_t was;
        pthread_sigmask(SIG_BLOCK, &p.sa_mask, &was);
        if (p.sa_flags & SA_RESETHAND) { /* a one-shot handler: the default from now on */
            memset(&wh__prev, 0, sizeof wh__prev);
            wh__prev.sa_handler = SIG_DFL;
        }
        if (info)
            p.sa_sigaction(sig, si, uc);
        else
            p.sa_handler(sig);
        pthread_sigmask(SIG_SETMASK, &was, NULL);
        __atomic_store_n(&wh__chaining, 0, __ATOMIC_RELEASE);
        /* It raised the signal again for the handler before it, and that
         * is this guard (it was installed over the guard, which then went
         * in front of it again): a circle, in which the signal can only
         * end in the default. faulthandler ends so, after its report. */
        sigset_t pend;
        struct sigaction cur;
        if (sigpending(&pend) != 0 || !sigismember(&pend, sig) || sigaction(sig, NULL, &cur) != 0 ||
            !wh__is_mine(&cur))
            return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* a fault repeats on return, now under the default; a sent signal is
     * pending (blocked in this handler) and is delivered on return */
    if (sent) raise(sig);
}

static void wh__on_bus(int sig, siginfo_t *si, void *uc) {
    int saved = errno;
    if (si && si->si_code > 0) {
        uintptr_t a = (uintptr_t)si->si_addr;
        for (wh__guard_chunk_t *c = __atomic_load_n(&wh__chunks, __ATOMIC_ACQUIRE); c;
             c = c->next) {
            for (int i = 0; i < WH__GUARD_CHUNK; i++) {
                wh__guard_ent_t *e = &c->ent[i];
                uintptr_t b = __atomic_load_n(&e->base, __ATOMIC_ACQUIRE);
                if (!b || a < b || a - b >= e->len) continue;
                uintptr_t pg = a & ~(wh__page - 1);
                void *p = mmap((void *)pg, b + e->len - pg, e->prot,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
                if (p != MAP_FAILED) {
                    __atomic_store_n(&e->shrunk, 1, __ATOMIC_RELEASE);
                    errno = saved;
                    return; /* the access runs again, on zero pages */
                }
            }
        }
    }
    wh__chain(sig, si, uc);
    errno = saved;
}

/* A fork while another thread holds wh__mu (mapping a ring slot, say)
 * must not leave the child's copy locked for ever. */
static void wh__fork_lock(void) { pthread_mutex_lock(&wh__mu); }
static void wh__fork_unlock(void) { pthread_mutex_unlock(&wh__mu); }
static pthread_once_t wh__atfork_once = PTHREAD_ONCE_INIT;
static void wh__atfork(void) { pthread_atfork(wh__fork_lock, wh__fork_unlock, wh__fork_unlock); }

void wh_guard_ensure(void) {
    struct sigaction cur, mine, old;
    pthread_once(&wh__atfork_once, wh__atfork);
    if (sigaction(SIGBUS, NULL, &cur) != 0 || wh__is_mine(&cur)) return;
    pthread_mutex_lock(&wh__mu);
    wh__installed = 1;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && !wh__is_mine(&cur)) {
        long pg = sysconf(_SC_PAGESIZE);
        if (pg > 0) wh__page = (uintptr_t)pg;
        memset(&mine, 0, sizeof mine);
        mine.sa_sigaction = wh__on_bus;
        mine.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
        sigemptyset(&mine.sa_mask);
        wh__prev = cur;
        if (sigaction(SIGBUS, &mine, &old) == 0 && !wh__is_mine(&old)) wh__prev = old;
    }
    pthread_mutex_unlock(&wh__mu);
}

void wh_guard_step_aside(void) {
    struct sigaction cur;
    pthread_mutex_lock(&wh__mu);
    if (sigaction(SIGBUS, NULL, &cur) == 0 && wh__is_mine(&cur)) sigaction(SIGBUS, &wh__prev, NULL);
    pthread_mutex_unlock(&wh__mu);
}

void wh_guard_restore(void) {
    if (__atomic_load_n(&wh__installed, __ATOMIC_ACQUIRE)) wh_guard_ensure();
}

/* A free entry (wh__mu held), the registry grown by a chunk if need be. */
static wh__guard_ent_t *wh__free_entry(void) {
    for (wh__guard_chunk_t *c = wh__chunks; c; c = c->next)
        for (int i = 0; i < WH__GUARD_CHUNK; i++)
            if (!c->ent[i].base) return &c->ent[i];
    wh__guard_chunk_t *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->next = wh__chunks;
    __atomic_store_n(&wh__chunks, c, __ATOMIC_RELEASE);
    return &c->ent[0];
}

static wh__guard_ent_t *wh__find(uintptr_t a) {
    for (wh__guard_chunk_t *c = __atomic_load_n(&wh__chunks, __ATOMIC_ACQUIRE); c; c = c->next)
        for (int i = 0; i < WH__GUARD_CHUNK; i++) {
            uintptr_t b = __atomic_load_n(&c->ent[i].base, __ATOMIC_ACQUIRE);
            if (b && a >= b && a - b < c->ent[i].len) return &c->ent[i];
        }
    return NULL;
}

void *wh_guard_mmap(size_t len, int prot, int flags, int fd, off_t off) {
    wh_guard_ensure();
    pthread_mutex_lock(&wh__mu);
    wh__guard_ent_t *e = wh__free_entry();
    if (!e) {
        pthread_mutex_unlock(&wh__mu);
        errno = ENOMEM;
        return MAP_FAILED;
    }
    void *p = mmap(NULL, len, prot, flags, fd, off);
    if (p != MAP_FAILED) {
        e->len = (len + wh__page - 1) & ~(wh__page - 1);
        e->prot = prot;
        e->shrunk = 0;
        e->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        e->need = (uint64_t)off + len;
        __atomic_store_n(&e->base, (uintptr_t)p, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&wh__mu);
    return p;
}

void wh_guard_munmap(void *addr, size_t len) {
    if (!addr) return;
    pthread_mutex_lock(&wh__mu);
    wh__guard_ent_t *e = wh__find((uintptr_t)addr);
    if (e) {
        __atomic_store_n(&e->base, 0, __ATOMIC_RELEASE);
        if (e->fd >= 0) close(e->fd);
        e->fd = -1;
    }
    munmap(addr, len);
    pthread_mutex_unlock(&wh__mu);
}

bool wh_guard_shrunk(const void *addr) {
    wh__guard_ent_t *e = wh__find((uintptr_t)addr);
    return e && __atomic_load_n(&e->shrunk, __ATOMIC_ACQUIRE);
}

bool wh_guard_cut(const void *addr, long long *size) {
    if (size) *size = -1;
    wh__guard_ent_t *e = wh__find((uintptr_t)addr);
    if (!e) return false;
    struct stat sb;
    bool known = e->fd >= 0 && fstat(e->fd, &sb) == 0;
    if (known && size) *size = (long long)sb.st_size;
    return __atomic_load_n(&e->shrunk, __ATOMIC_ACQUIRE) ||
           (known && (sb.st_size < 0 || (uint64_t)sb.st_size < e->need));
}
