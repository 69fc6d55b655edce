/* Fault-injection points (see wh_fault.h). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wh.h"
#include "wh_fault.h"

#ifdef WH_FAULTS

typedef struct {
    const char *env;  /* variable naming the pause in seconds */
    const char *what; /* printed so a test can synchronise on it */
    double secs;      /* < 0: no fault point */
    int pid;          /* process that read env: a forked child reads again */
} wh__fault_t;

static wh__fault_t wh__put = {"WIREHEAD_FAULT_PUT_PAUSE", "put", -1, 0};
static wh__fault_t wh__seal = {"WIREHEAD_FAULT_SEAL_PAUSE", "seal", -1, 0};

static void wh__pause(wh__fault_t *f) {
    /* read once per process: getenv is not safe against a concurrent setenv */
    if (__atomic_load_n(&f->pid, __ATOMIC_ACQUIRE) != (int)getpid()) {
        const char *v = getenv(f->env);
        f->secs = (v && *v) ? atof(v) : -1;
        __atomic_store_n(&f->pid, (int)getpid(), __ATOMIC_RELEASE);
    }
    double secs = f->secs;
    if (secs < 0) return;
    fprintf(stderr, "wirehead: fault pause in %s\n", f->what);
    fflush(stderr);
    if (secs > 0) wh_sleep_ms((unsigned)(secs * 1000.0));
}

void wh_fault_put_midway(void) { wh__pause(&wh__put); }
void wh_fault_seal_midway(void) { wh__pause(&wh__seal); }

/* A kill point: its variable names the step (>= 1) at which the process
 * SIGKILLs itself; read once per process like the pauses. */
typedef struct {
    const char *env;
    int step; /* < 1: none */
    int pid;  /* process that read env */
} wh__kill_t;

static wh__kill_t wh__seal_kill = {"WIREHEAD_FAULT_SEAL_KILL", -1, 0};
static wh__kill_t wh__commit_kill = {"WIREHEAD_FAULT_SPEC_COMMIT_KILL", -1, 0};

static void wh__kill_at(wh__kill_t *k, int step, const char *what) {
    if (__atomic_load_n(&k->pid, __ATOMIC_ACQUIRE) != (int)getpid()) {
        const char *v = getenv(k->env);
        k->step = (v && *v) ? atoi(v) : -1;
        __atomic_store_n(&k->pid, (int)getpid(), __ATOMIC_RELEASE);
    }
    if (step != k->step) return;
    fprintf(stderr, "wirehead: fault kill %s\n", what);
    fflush(stderr);
    kill(getpid(), SIGKILL);
    for (;;) pause(); /* never run past the step, even before the signal lands */
}

/* WIREHEAD_FAULT_CUT: read once per process like the pauses. */
static char wh__cut_site[64];
static bool wh__cut_inside;
static int wh__cut_pid = 0;
static int wh__cut_done = 0;

/* The file mapped at addr and addr's offset in it, from /proc/self/maps. */
static bool wh__mapped_file(const void *addr, char *path, size_t cap, unsigned long long *at) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return false;
    char line[4352];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        unsigned long long off;
        int name = 0;
        if (sscanf(line, "%lx-%lx %*s %llx %*s %*s %n", &lo, &hi, &off, &name) < 3 || !name)
            continue;
        if ((uintptr_t)addr < lo || (uintptr_t)addr >= hi || line[name] != '/') continue;
        line[strcspn(line, "\n")] = 0;
        snprintf(path, cap, "%s", line + name);
        *at = off + ((uintptr_t)addr - lo);
        found = true;
    }
    fclose(f);
    return found;
}

void wh_fault_cut(const char *site, const void *addr) {
    if (__atomic_load_n(&wh__cut_pid, __ATOMIC_ACQUIRE) != (int)getpid()) {
        const char *v = getenv("WIREHEAD_FAULT_CUT");
        snprintf(wh__cut_site, sizeof wh__cut_site, "%s", v ? v : "");
        char *colon = strchr(wh__cut_site, ':');
        wh__cut_inside = colon && !strcmp(colon, ":inside");
        if (colon) *colon = 0;
        __atomic_store_n(&wh__cut_done, 0, __ATOMIC_RELEASE);
        __atomic_store_n(&wh__cut_pid, (int)getpid(), __ATOMIC_RELEASE);
    }
    if (strcmp(site, wh__cut_site) != 0 || __atomic_exchange_n(&wh__cut_done, 1, __ATOMIC_ACQ_REL))
        return;
    char path[4096];
    unsigned long long at = 0;
    if (!wh__mapped_file(addr, path, sizeof path, &at) || strncmp(path, "/dev/shm/", 9) != 0) {
        fprintf(stderr, "wirehead: fault cut at %s: no /dev/shm file is mapped there\n", site);
        return;
    }
    /* inside: one byte past addr, so the rest of its page reads as zeros
     * in place (no fault) and the pages after it are past the end */
    off_t to = wh__cut_inside ? (off_t)at + 1 : 0;
    fprintf(stderr, "wirehead: fault cut at %s: %s to %lld bytes\n", site, path, (long long)to);
    fflush(stderr);
    if (truncate(path, to) != 0) perror("wirehead: fault cut");
}
void wh_fault_seal_step(int step) {
    char what[48];
    snprintf(what, sizeof what, "at seal step %d", step);
    wh__kill_at(&wh__seal_kill, step, what);
}

void wh_fault_spec_committed(void) { wh__kill_at(&wh__commit_kill, 1, "after spec commit"); }

/* WIREHEAD_FAULT_SPEC_KILL: read once per process like the others. A call
 * is counted at its first step (step 1). */
static char wh__spec_op[16];
static int wh__spec_step = -1, wh__spec_nth = 1, wh__spec_calls, wh__spec_pid;

void wh_fault_spec_step(const char *op, int step) {
    if (__atomic_load_n(&wh__spec_pid, __ATOMIC_ACQUIRE) != (int)getpid()) {
        const char *v = getenv("WIREHEAD_FAULT_SPEC_KILL");
        wh__spec_op[0] = 0;
        wh__spec_step = -1;
        wh__spec_nth = 1;
        wh__spec_calls = 0;
        if (v && sscanf(v, "%15[a-z]:%d:%d", wh__spec_op, &wh__spec_step, &wh__spec_nth) < 2)
            wh__spec_step = -1;
        __atomic_store_n(&wh__spec_pid, (int)getpid(), __ATOMIC_RELEASE);
    }
    if (wh__spec_step < 1 || strcmp(op, wh__spec_op) != 0) return;
    if (step == 1) wh__spec_calls++;
    if (step != wh__spec_step || wh__spec_calls != wh__spec_nth) return;
    fprintf(stderr, "wirehead: fault kill at %s step %d\n", op, step);
    fflush(stderr);
    kill(getpid(), SIGKILL);
    for (;;) pause();
}

#else
typedef int wh__no_faults_t; /* a release build: the points are inline stubs */
#endif
